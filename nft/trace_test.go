package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"golang.org/x/sys/unix"
)

func TestTrace(t *testing.T) {
	rs := Build(demoState(), demoConfig())
	node := []netip.Addr{mustAddr("10.99.0.1"), mustAddr("fd00:99::1"), mustAddr("127.0.0.1")}
	pod, podB, outside := mustAddr("10.244.0.20"), mustAddr("10.244.0.10"), mustAddr("10.99.0.2")
	tests := []struct {
		name string
		pkt  nftlib.Packet
		want []string // outcomes without the chain path
	}{
		{
			name: "pod to ClusterIP: both endpoints, no masquerade",
			pkt:  nftlib.Packet{Src: pod, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node},
			want: []string{"0.500 dnat 10.244.0.10:8080", "0.500 dnat 10.244.0.11:8080"},
		},
		{
			name: "off-cluster source to ClusterIP is masqueraded",
			pkt:  nftlib.Packet{Src: outside, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node},
			want: []string{"0.500 dnat 10.244.0.10:8080 masquerade", "0.500 dnat 10.244.0.11:8080 masquerade"},
		},
		{
			name: "hairpin: a pod reaching itself is masqueraded",
			pkt:  nftlib.Packet{Src: podB, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node},
			want: []string{"0.500 dnat 10.244.0.10:8080 masquerade", "0.500 dnat 10.244.0.11:8080"},
		},
		{
			name: "the node itself to a ClusterIP (output hook)",
			pkt:  nftlib.Packet{Src: mustAddr("10.99.0.1"), Dst: mustAddr("10.96.0.53"), Proto: unix.IPPROTO_UDP, Dport: 53, Output: true, Local: node},
			want: []string{"1.000 dnat 10.244.0.10:5353 masquerade"},
		},
		{
			name: "NodePort on a node address: external, masqueraded",
			pkt:  nftlib.Packet{Src: outside, Dst: mustAddr("10.99.0.1"), Proto: unix.IPPROTO_TCP, Dport: 30080, Local: node},
			want: []string{"0.500 dnat 10.244.0.10:8080 masquerade", "0.500 dnat 10.244.0.11:8080 masquerade"},
		},
		{
			name: "no NodePort on loopback",
			pkt:  nftlib.Packet{Src: mustAddr("127.0.0.1"), Dst: mustAddr("127.0.0.1"), Proto: unix.IPPROTO_TCP, Dport: 30080, Output: true, Local: node},
			want: []string{"1.000 no dnat"},
		},
		{
			name: "wrong protocol does not match: a port of no Service port, rejected (cluster-ips-check)",
			pkt:  nftlib.Packet{Src: pod, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_UDP, Dport: 80, Local: node},
			want: []string{"1.000 reject"},
		},
		{
			name: "IPv6 ClusterIP has the IPv6 endpoint only",
			pkt:  nftlib.Packet{Src: mustAddr("fd00:10:244::20"), Dst: mustAddr("fd00:10:96::10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node},
			want: []string{"1.000 dnat [fd00:10:244::10]:8080"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkTrace(t, rs, tt.pkt, tt.want) })
	}
}

// The chain path shows the iptables-mode topology a NodePort packet takes.
func TestTracePath(t *testing.T) {
	rs := Build(demoState(), demoConfig())
	out := mustTrace(t, rs, nftlib.Packet{Src: mustAddr("10.99.0.2"), Dst: mustAddr("10.99.0.1"), Proto: unix.IPPROTO_TCP, Dport: 30080, Local: []netip.Addr{mustAddr("10.99.0.1")}})
	if len(out) != 2 {
		t.Fatalf("outcomes: %v", out)
	}
	// Each hook runs the affinity and delta tables' base chains first
	// (they find nothing). The ClusterIP masquerade rule in KUBE-SVC
	// matches the ClusterIP only, so external traffic is marked once, in
	// KUBE-EXT.
	want := "filter-prerouting,KUBE-PROXY-FIREWALL,filter-prerouting,KUBE-PROXY-FIREWALL,filter-prerouting,KUBE-PROXY-FIREWALL," +
		"nat-prerouting,KUBE-SERVICES,KUBE-NODEPORTS,nat-prerouting,KUBE-SERVICES,KUBE-NODEPORTS," +
		"nat-prerouting,KUBE-SERVICES,KUBE-NODEPORTS,KUBE-EXT-CDGGSHYLG3RE2FKL,KUBE-MARK-MASQ,KUBE-SVC-CDGGSHYLG3RE2FKL,KUBE-SEP-3MRQQDVYO2GBIBDV," +
		"filter-forward,KUBE-EXTERNAL-SERVICES,filter-forward,KUBE-EXTERNAL-SERVICES,filter-forward,KUBE-FORWARD," +
		"nat-postrouting,KUBE-POSTROUTING"
	if !strings.Contains(strings.Join(out[0].Chains, ","), want) {
		t.Errorf("path %v, want it to contain %s", out[0].Chains, want)
	}
}

// checkTrace compares a packet's outcomes (without their chain paths) with want.
func checkTrace(t *testing.T, rs *nftlib.Ruleset, pkt nftlib.Packet, want []string) {
	t.Helper()
	var got []string
	outcomes := mustTrace(t, rs, pkt)
	for _, o := range outcomes {
		got = append(got, strings.SplitN(o.String(), " via ", 2)[0])
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s\nfull: %v", strings.Join(got, "\n"), strings.Join(want, "\n"), outcomes)
	}
}

func mustTrace(t *testing.T, rs *nftlib.Ruleset, pkt nftlib.Packet) []nftlib.Outcome {
	t.Helper()
	out, err := rs.Trace(pkt)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
