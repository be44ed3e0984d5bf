package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

type goldenCase struct {
	file string
	st   *proxier.State
	cfg  Config
}

// goldenCases are representative states: every term and chain kind appears.
func goldenCases() []goldenCase {
	sctp := func() *proxier.State {
		st := proxier.NewState()
		n := proxierName("telco", "sig", "sctp")
		st.Services[n] = &proxier.ServicePort{Name: n, Protocol: proxier.SCTP, Port: 3868, NodePort: 31868,
			ClusterIPs:  []netip.Addr{mustAddr("10.96.5.5")},
			ExternalIPs: []netip.Addr{mustAddr("192.0.2.10")}, LoadBalancerIPs: []netip.Addr{mustAddr("198.51.100.7")}}
		st.Endpoints[n] = []proxier.Endpoint{
			{Addr: mustAddr("10.244.1.5"), Port: 3868, Ready: true, Serving: true},
			{Addr: mustAddr("10.244.1.6"), Port: 3868, Ready: false, Serving: true, Terminating: true},
		}
		return st
	}
	ipv6only := func() *proxier.State {
		st := proxier.NewState()
		n := proxierName("default", "v6", "")
		st.Services[n] = &proxier.ServicePort{Name: n, Protocol: proxier.UDP, Port: 53, ClusterIPs: []netip.Addr{mustAddr("fd00:10:96::53")}}
		st.Endpoints[n] = []proxier.Endpoint{
			{Addr: mustAddr("fd00:10:244::1"), Port: 53, Ready: true, Serving: true},
			{Addr: mustAddr("fd00:10:244::2"), Port: 53, Ready: true, Serving: true},
			{Addr: mustAddr("fd00:10:244::3"), Port: 53, Ready: true, Serving: true},
		}
		return st
	}
	long := func() *proxier.State {
		// Kubernetes allows 63-character namespaces and names: comments
		// longer than nft's 128 characters are cut, the same in both views.
		st := proxier.NewState()
		n := proxierName(strings.Repeat("n", 63), strings.Repeat("s", 63), "a-fifteen-chars")
		st.Services[n] = &proxier.ServicePort{Name: n, Protocol: proxier.TCP, Port: 443, ClusterIPs: []netip.Addr{mustAddr("fd00:10:96::443")}}
		st.Endpoints[n] = []proxier.Endpoint{{Addr: mustAddr("fd00:10:244:ffff:ffff:ffff:ffff:ffff"), Port: 8443, Ready: true, Serving: true}}
		return st
	}
	withNode := func() *proxier.State {
		st := demoState()
		st.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:10:244::/64")}
		st.Node.IPs = []netip.Addr{mustAddr("10.99.0.1"), mustAddr("fd00:99::1")}
		return st
	}
	affinity := func() *proxier.State {
		// sessionAffinity: ClientIP on a dual-stack TCP Service with a
		// NodePort and on an IPv4 UDP one with eTP=Local (KUBE-SVL too).
		st := demoState()
		for name, svc := range st.Services {
			svc := *svc
			svc.AffinityTimeout = 10800 * time.Second
			if svc.Protocol == proxier.UDP {
				svc.AffinityTimeout = 90 * time.Second
				svc.ExternalPolicyLocal = true
			}
			st.Services[name] = &svc
		}
		return st
	}
	prefixCfg := demoConfig()
	prefixCfg.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectInterfaceNamePrefix, InterfacePrefix: "veth"}
	prefixCfg.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24"), netip.MustParsePrefix("fd00:99::/64")}
	prefixCfg.ConntrackTCPBeLiberal = true
	bridgeCfg := demoConfig()
	bridgeCfg.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectBridgeInterface, BridgeInterface: "kbr0"}
	bridgeCfg.NodePortPrimary = true
	nodeCIDRCfg := demoConfig()
	nodeCIDRCfg.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectNodeCIDR}
	masqAll := demoConfig()
	masqAll.MasqueradeAll = true
	masqAll.MasqueradeBit = 10
	localhost := demoConfig()
	localhost.LocalhostNodePorts = true // iptables mode's default
	localhostCIDRs := localhost
	localhostCIDRs.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.99.0.0/24"), netip.MustParsePrefix("fd00:99::/64")}
	return []goldenCase{
		{"demo.nft", demoState(), demoConfig()},
		{"localhost-nodeports.nft", affinity(), localhost},
		{"localhost-nodeports-cidrs.nft", withNode(), localhostCIDRs},
		{"masquerade-all.nft", demoState(), masqAll},
		{"sctp-external-terminating.nft", sctp(), demoConfig()},
		{"ipv6-only-unnamed-port.nft", ipv6only(), DefaultConfig()},
		{"long-names.nft", long(), demoConfig()},
		{"features.nft", featureState(), demoConfig()},
		{"flags-interface-prefix-nodeport-cidrs-liberal.nft", withNode(), prefixCfg},
		{"flags-bridge-nodeport-primary.nft", withNode(), bridgeCfg},
		{"flags-node-cidr.nft", withNode(), nodeCIDRCfg},
		{"session-affinity.nft", affinity(), demoConfig()},
	}
}

// Golden nft text for representative states: a change to what we program
// shows up in review as a diff of these files (go test ./nft -update).
func TestGolden(t *testing.T) {
	for _, tt := range goldenCases() {
		t.Run(tt.file, func(t *testing.T) {
			golden.Check(t, tt.file, "render", Build(tt.st, tt.cfg).String())
		})
	}
}
