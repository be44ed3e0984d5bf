package proxier

import (
	"fmt"
	"net/netip"
)

// Settings are the flags both modes (nftables and IPVS) read alike: which
// traffic is the pods', which gets masqueraded and where NodePorts listen.
type Settings struct {
	// ClusterCIDRs: traffic from outside them to a ClusterIP is masqueraded
	// (--cluster-cidr, detect-local-mode ClusterCIDR).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to ClusterIPs (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit that asks for SNAT (--iptables-masquerade-bit, default 14).
	MasqueradeBit uint
	// DetectLocal says how to tell pod traffic from other traffic
	// (--detect-local-mode and its companions).
	DetectLocal LocalDetector
	// NodePortAddresses restricts NodePorts to node addresses within
	// these prefixes (--nodeport-addresses); empty: every node address.
	// NodePortPrimary takes the node's primary addresses (the value
	// "primary"): those of the Node object.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool
}

// DefaultSettings are kube-proxy's defaults.
func DefaultSettings() Settings { return Settings{MasqueradeBit: 14} }

// Validate reports values that cannot work.
func (s Settings) Validate() error {
	if s.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d out of range 0-31", s.MasqueradeBit)
	}
	return nil
}

// MasqueradeMark is the fwmark bit that asks for SNAT.
func (s Settings) MasqueradeMark() uint32 { return 1 << s.MasqueradeBit }

// The --detect-local-mode values.
const (
	DetectClusterCIDR         = "ClusterCIDR"
	DetectNodeCIDR            = "NodeCIDR"
	DetectBridgeInterface     = "BridgeInterface"
	DetectInterfaceNamePrefix = "InterfaceNamePrefix"
)

// LocalDetector is kube-proxy's detect-local configuration.
type LocalDetector struct {
	Mode            string // one of the Detect* modes; "" is ClusterCIDR
	BridgeInterface string // --pod-bridge-interface
	InterfacePrefix string // --pod-interface-name-prefix
}
