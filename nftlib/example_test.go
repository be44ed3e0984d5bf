package nftlib_test

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// A table that sends TCP port 80 of one address to a backend: rendered as
// `nft -f` input and traced for one packet. Kernel.CommitTx(FullTx(...))
// would program it; FakeKernel holds it in memory for tests.
func Example() {
	web := netip.MustParseAddr("192.0.2.10")
	table := &nftlib.Table{Family: nftlib.IPv4, Name: "example", Comment: "an example",
		Maps: []*nftlib.Map{{Name: "destinations", Key: []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport},
			Elements: []nftlib.Element{{Key: nftlib.Key{Addr: web, Proto: unix.IPPROTO_TCP, Port: 80}, Verdict: nftlib.GotoChain("web")}}}},
		Chains: []*nftlib.Chain{
			{Name: "prerouting", Hook: &nftlib.Hook{Type: "nat", Hook: "prerouting", Priority: -100},
				Rules: []nftlib.Rule{nftlib.R(nftlib.Vmap("destinations", nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport))}},
			{Name: "web", Comment: "the web backend", Rules: []nftlib.Rule{
				nftlib.R(nftlib.DNAT{Addr: netip.MustParseAddr("10.0.0.5"), Port: 8080}).WithComment("backend 1"),
			}},
		}}
	rs := &nftlib.Ruleset{Tables: []*nftlib.Table{table}}
	fmt.Print(rs)

	out, err := rs.Trace(nftlib.Packet{Src: netip.MustParseAddr("198.51.100.7"), Dst: web, Proto: unix.IPPROTO_TCP, Dport: 80})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range out {
		fmt.Println(o)
	}
	// Output:
	// table ip example {
	// 	comment "an example"
	// 	map destinations {
	// 		type ipv4_addr . inet_proto . inet_service : verdict
	// 		elements = { 192.0.2.10 . tcp . 80 : goto web }
	// 	}
	//
	// 	chain prerouting {
	// 		type nat hook prerouting priority dstnat; policy accept;
	// 		ip daddr . meta l4proto . th dport vmap @destinations
	// 	}
	//
	// 	chain web {
	// 		comment "the web backend"
	// 		dnat to 10.0.0.5:8080 comment "backend 1"
	// 	}
	// }
	// 1.000 dnat 10.0.0.5:8080 via prerouting,web
}
