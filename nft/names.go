package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"unicode/utf8"

	"github.com/kube-nftproxy/kube-nftproxy/model"
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

// chainName is prefix and the first 16 characters of
// base32(sha256(name.String() + proto.Lower() + endpoint)), as iptables
// mode names its per-service and per-endpoint chains.
func chainName(prefix string, name model.ServicePortName, proto model.Protocol, endpoint string) string {
	var out [32]byte
	return string(appendChainName(out[:0], prefix, name, proto, endpoint))
}

// appendChainName appends chainName's name to dst. It hashes in stack
// buffers: a full sync names every chain anew (110k at 10k Services x 10
// endpoints), and the caller decides where the name lives.
func appendChainName[E string | []byte](dst []byte, prefix string, name model.ServicePortName, proto model.Protocol, endpoint E) []byte {
	var in [192]byte
	s := append(in[:0], name.Namespace...)
	s = append(s, '/')
	s = append(s, name.Name...)
	if name.Port != "" {
		s = append(s, ':')
		s = append(s, name.Port...)
	}
	if p := string(proto); isASCII(p) {
		for i := 0; i < len(p); i++ {
			c := p[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			s = append(s, c)
		}
	} else {
		s = append(s, proto.Lower()...)
	}
	s = append(s, endpoint...)
	sum := sha256.Sum256(s)
	var enc [56]byte // base32 of 32 bytes, padded
	base32.StdEncoding.Encode(enc[:], sum[:])
	return append(append(dst, prefix...), enc[:16]...)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// ServiceChain is KUBE-SVC-<hash>: cluster traffic of one service port.
func ServiceChain(name model.ServicePortName, proto model.Protocol) string {
	return chainName(prefixSVC, name, proto, "")
}

// LocalServiceChain is KUBE-SVL-<hash>: like KUBE-SVC but local endpoints only.
func LocalServiceChain(name model.ServicePortName, proto model.Protocol) string {
	return chainName(prefixSVL, name, proto, "")
}

// ExternalChain is KUBE-EXT-<hash>: external (NodePort, external IP, LB) traffic.
func ExternalChain(name model.ServicePortName, proto model.Protocol) string {
	return chainName(prefixEXT, name, proto, "")
}

// FirewallChain is KUBE-FW-<hash>: loadBalancerSourceRanges.
func FirewallChain(name model.ServicePortName, proto model.Protocol) string {
	return chainName(prefixFW, name, proto, "")
}

// EndpointChain is KUBE-SEP-<hash> for one endpoint ("ip:port") of a service port.
func EndpointChain(name model.ServicePortName, proto model.Protocol, endpoint string) string {
	return chainName(prefixSEP, name, proto, endpoint)
}

// fragmentKey is the key of a service port's fragment in a Table: its
// name's String form, so that fragments are listed in the order of
// model.ServicePortName.Compare.
func fragmentKey(name model.ServicePortName) string { return name.String() }

// fragmentKeys is fragmentKey of each name.
func fragmentKeys(names []model.ServicePortName) []string {
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = fragmentKey(n)
	}
	return keys
}
