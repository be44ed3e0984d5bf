package nft

import (
	"crypto/sha256"
	"encoding/base32"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Chain-name prefixes of iptables mode, kept so that our rules line up with an
// iptables-save dump of the same cluster.
const (
	prefixSVC = "KUBE-SVC-"
	prefixSVL = "KUBE-SVL-"
	prefixEXT = "KUBE-EXT-"
	prefixFW  = "KUBE-FW-"
	prefixSEP = "KUBE-SEP-"
)

// hash16 is the first 16 characters of base32(sha256(s)), the suffix
// iptables mode gives its per-service and per-endpoint chains.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func servicePortHash(name proxier.ServicePortName, proto proxier.Protocol) string {
	return hash16(name.String() + proto.Lower())
}

// ServiceChain is KUBE-SVC-<hash>: cluster traffic of one service port.
func ServiceChain(name proxier.ServicePortName, proto proxier.Protocol) string {
	return prefixSVC + servicePortHash(name, proto)
}

// LocalServiceChain is KUBE-SVL-<hash>: like KUBE-SVC but local endpoints only.
func LocalServiceChain(name proxier.ServicePortName, proto proxier.Protocol) string {
	return prefixSVL + servicePortHash(name, proto)
}

// ExternalChain is KUBE-EXT-<hash>: external (NodePort, external IP, LB) traffic.
func ExternalChain(name proxier.ServicePortName, proto proxier.Protocol) string {
	return prefixEXT + servicePortHash(name, proto)
}

// FirewallChain is KUBE-FW-<hash>: loadBalancerSourceRanges.
func FirewallChain(name proxier.ServicePortName, proto proxier.Protocol) string {
	return prefixFW + servicePortHash(name, proto)
}

// EndpointChain is KUBE-SEP-<hash> for one endpoint ("ip:port") of a service port.
func EndpointChain(name proxier.ServicePortName, proto proxier.Protocol, endpoint string) string {
	return prefixSEP + hash16(name.String()+proto.Lower()+endpoint)
}
