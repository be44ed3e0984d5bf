package nft

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// featureState has one service port per Service feature, on node-1:
//   - none: no endpoints at all (ClusterIP, NodePort, external IP)
//   - etp: externalTrafficPolicy Local, one local and one remote endpoint, NodePort + LB IP
//   - etp-none: externalTrafficPolicy Local, remote endpoints only
//   - itp: internalTrafficPolicy Local, one local and one remote endpoint
//   - itp-none: internalTrafficPolicy Local, remote endpoints only
//   - fw: LoadBalancer IP with loadBalancerSourceRanges 192.0.2.0/24 and 10.99.0.1/32
func featureState() *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	add := func(name string, port uint16, svc model.ServicePort, eps ...model.Endpoint) {
		n := proxierName("feat", name, "p")
		svc.Name, svc.Protocol, svc.Port = n, model.TCP, port
		st.Services = st.Services.With(n, &svc)
		st.Endpoints = st.Endpoints.With(n, eps)
	}
	ep := func(ip, node string) model.Endpoint {
		return model.Endpoint{Addr: mustAddr(ip), Port: 8080, NodeName: node, Ready: true, Serving: true}
	}
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, mustAddr(a))
		}
		return out
	}
	add("none", 80, model.ServicePort{ClusterIPs: ips("10.96.1.1"), NodePort: 30001, ExternalIPs: ips("203.0.113.1")})
	add("etp", 80, model.ServicePort{ClusterIPs: ips("10.96.1.2"), NodePort: 30002, LoadBalancerIPs: ips("203.0.113.2"), ExternalPolicyLocal: true},
		ep("10.244.0.10", "node-1"), ep("10.244.9.10", "node-2"))
	add("etp-none", 80, model.ServicePort{ClusterIPs: ips("10.96.1.3"), NodePort: 30003, ExternalPolicyLocal: true},
		ep("10.244.9.11", "node-2"))
	add("itp", 80, model.ServicePort{ClusterIPs: ips("10.96.1.4"), InternalPolicyLocal: true},
		ep("10.244.0.12", "node-1"), ep("10.244.9.12", "node-2"))
	add("itp-none", 80, model.ServicePort{ClusterIPs: ips("10.96.1.5"), InternalPolicyLocal: true},
		ep("10.244.9.13", "node-2"))
	add("fw", 80, model.ServicePort{ClusterIPs: ips("10.96.1.6"), LoadBalancerIPs: ips("203.0.113.6"),
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.99.0.1/32")}},
		ep("10.244.0.14", "node-1"))
	return st
}

// Each case pins upstream iptables-mode behaviour (pkg/proxy/iptables,
// syncProxyRules), named in the case.
func TestTraceFeatures(t *testing.T) {
	st := featureState()
	st.Node.IPs = []netip.Addr{mustAddr("10.99.0.1")}
	rs := Build(st, demoConfig())
	node := []netip.Addr{mustAddr("10.99.0.1"), mustAddr("127.0.0.1"), mustAddr("203.0.113.6")}
	pod, outside := mustAddr("10.244.0.20"), mustAddr("192.0.2.7")
	tcp := func(src, dst string, port uint16) nftlib.Packet {
		return nftlib.Packet{Src: mustAddr(src), Dst: mustAddr(dst), Proto: unix.IPPROTO_TCP, Dport: port, Local: node}
	}
	tests := []struct {
		name string
		pkt  nftlib.Packet
		want []string
	}{
		// No endpoints: REJECT for every kind of address ("has no endpoints").
		{"no endpoints, ClusterIP", tcp(pod.String(), "10.96.1.1", 80), []string{"1.000 reject"}},
		{"no endpoints, NodePort", tcp(outside.String(), "10.99.0.1", 30001), []string{"1.000 reject"}},
		{"no endpoints, external IP", tcp(outside.String(), "203.0.113.1", 80), []string{"1.000 reject"}},
		// eTP=Local: external traffic only to local endpoints, source kept.
		{"eTP Local, external client to NodePort", tcp(outside.String(), "10.99.0.1", 30002), []string{"1.000 dnat 10.244.0.10:8080"}},
		{"eTP Local, external client to LB IP", tcp(outside.String(), "203.0.113.2", 80), []string{"1.000 dnat 10.244.0.10:8080"}},
		// "pod traffic for ... external destinations": cluster-wide, not masqueraded.
		{"eTP Local, pod to LB IP goes cluster-wide", tcp(pod.String(), "203.0.113.2", 80),
			[]string{"0.500 dnat 10.244.0.10:8080", "0.500 dnat 10.244.9.10:8080"}},
		// "masquerade/route LOCAL traffic": the node itself, cluster-wide and masqueraded.
		{"eTP Local, node to LB IP", nftlib.Packet{Src: mustAddr("10.99.0.1"), Dst: mustAddr("203.0.113.2"), Proto: unix.IPPROTO_TCP, Dport: 80, Output: true, Local: node},
			[]string{"0.500 dnat 10.244.0.10:8080 masquerade", "0.500 dnat 10.244.9.10:8080 masquerade"}},
		// ClusterIP traffic ignores eTP.
		{"eTP Local, ClusterIP is cluster-wide", tcp(pod.String(), "10.96.1.2", 80),
			[]string{"0.500 dnat 10.244.0.10:8080", "0.500 dnat 10.244.9.10:8080"}},
		// eTP=Local without local endpoints: external DROP ("has no local endpoints"), pods still served.
		{"eTP Local, no local endpoint, external client", tcp(outside.String(), "10.99.0.1", 30003), []string{"1.000 drop"}},
		{"eTP Local, no local endpoint, pod to ClusterIP", tcp(pod.String(), "10.96.1.3", 80), []string{"1.000 dnat 10.244.9.11:8080"}},
		// iTP=Local: ClusterIP traffic to local endpoints only; DROP without one.
		{"iTP Local", tcp(pod.String(), "10.96.1.4", 80), []string{"1.000 dnat 10.244.0.12:8080"}},
		{"iTP Local, no local endpoint", tcp(pod.String(), "10.96.1.5", 80), []string{"1.000 drop"}},
		// loadBalancerSourceRanges: sources outside the ranges are dropped before DNAT.
		{"source ranges, allowed", tcp(outside.String(), "203.0.113.6", 80), []string{"1.000 dnat 10.244.0.14:8080 masquerade"}},
		{"source ranges, refused", tcp("198.51.100.9", "203.0.113.6", 80), []string{"1.000 drop"}},
		{"source ranges, node address in a range", nftlib.Packet{Src: mustAddr("10.99.0.1"), Dst: mustAddr("203.0.113.6"), Proto: unix.IPPROTO_TCP, Dport: 80, Output: true, Local: node},
			[]string{"1.000 dnat 10.244.0.14:8080 masquerade"}},
		// "For VIP-like LBs, the VIP is often added as a local address":
		// the node's requests then come from the LB IP itself.
		{"source ranges, node traffic from its own LB IP", nftlib.Packet{Src: mustAddr("203.0.113.6"), Dst: mustAddr("203.0.113.6"), Proto: unix.IPPROTO_TCP, Dport: 80, Output: true, Local: node},
			[]string{"1.000 dnat 10.244.0.14:8080 masquerade"}},
		{"source ranges do not apply to the ClusterIP", tcp("10.99.0.2", "10.96.1.6", 80), []string{"1.000 dnat 10.244.0.14:8080 masquerade"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkTrace(t, rs, tt.pkt, tt.want) })
	}
}

// --detect-local-mode and --nodeport-addresses change which traffic counts
// as pod traffic and which node addresses serve NodePorts.
func TestTraceFlags(t *testing.T) {
	st := demoState()
	st.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	st.Node.IPs = []netip.Addr{mustAddr("10.99.0.1")}
	node := []netip.Addr{mustAddr("10.99.0.1"), mustAddr("10.98.0.1"), mustAddr("127.0.0.1")}
	web := func(src, iif string) nftlib.Packet {
		return nftlib.Packet{Src: mustAddr(src), Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node, Iif: iif}
	}
	nodePort := func(dst string) nftlib.Packet {
		return nftlib.Packet{Src: mustAddr("10.99.0.2"), Dst: mustAddr(dst), Proto: unix.IPPROTO_TCP, Dport: 30080, Local: node}
	}
	cfg := func(change func(*Config)) Config {
		c := demoConfig()
		change(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		pkt  nftlib.Packet
		masq bool // whether the ClusterIP packet is masqueraded
		dnat bool
	}{
		{"NodeCIDR: a source in the node's pod CIDR is a pod", cfg(func(c *Config) { c.DetectLocal.Mode = proxier.DetectNodeCIDR }), web("10.244.0.20", ""), false, true},
		{"NodeCIDR: another node's pod is not local", cfg(func(c *Config) { c.DetectLocal.Mode = proxier.DetectNodeCIDR }), web("10.244.7.20", ""), true, true},
		{"BridgeInterface: from the bridge is a pod", cfg(func(c *Config) {
			c.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectBridgeInterface, BridgeInterface: "kbr0"}
		}), web("10.1.2.3", "kbr0"), false, true},
		{"BridgeInterface: elsewhere is not", cfg(func(c *Config) {
			c.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectBridgeInterface, BridgeInterface: "kbr0"}
		}), web("10.244.0.20", "eth0"), true, true},
		{"InterfaceNamePrefix: veth* is a pod", cfg(func(c *Config) {
			c.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectInterfaceNamePrefix, InterfacePrefix: "veth"}
		}), web("10.1.2.3", "veth12ab"), false, true},
		{"InterfaceNamePrefix: eth0 is not", cfg(func(c *Config) {
			c.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectInterfaceNamePrefix, InterfacePrefix: "veth"}
		}), web("10.1.2.3", "eth0"), true, true},
		{"nodeport-addresses: inside the CIDR", cfg(func(c *Config) { c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")} }), nodePort("10.99.0.1"), true, true},
		{"nodeport-addresses: another node address", cfg(func(c *Config) { c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")} }), nodePort("10.98.0.1"), false, false},
		{"nodeport-addresses primary", cfg(func(c *Config) { c.NodePortPrimary = true }), nodePort("10.99.0.1"), true, true},
		{"nodeport-addresses primary: not another address", cfg(func(c *Config) { c.NodePortPrimary = true }), nodePort("10.98.0.1"), false, false},
		{"default: every node address", demoConfig(), nodePort("10.98.0.1"), true, true},
		// Upstream's NodePortAddresses works per family: a family without a
		// CIDR keeps NodePorts on all of its addresses.
		{"nodeport-addresses of the other family only", cfg(func(c *Config) { c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("fd00:99::/64")} }), nodePort("10.98.0.1"), true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, o := range mustTrace(t, Build(st, tt.cfg), tt.pkt) {
				if o.DNAT.IsValid() != tt.dnat || o.Masquerade != tt.masq {
					t.Errorf("%v: want dnat=%v masquerade=%v", o, tt.dnat, tt.masq)
				}
			}
		})
	}
}
