package conntrack

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// BenchmarkKernelClean times one cleanup (read the UDP and SCTP tables of
// both families, judge, delete) with 10k live UDP entries in the table and
// `stale` of them made stale by the sync.
func BenchmarkKernelClean(b *testing.B) {
	for _, stale := range []int{0, 100, 10_000} {
		b.Run(fmt.Sprintf("entries=10000/stale=%d", stale), func(b *testing.B) {
			ns := testNetns(b)
			live := netip.MustParseAddrPort("10.96.0.10:53")   // DNATed to 127.0.0.1:5353, an endpoint
			doomed := netip.MustParseAddrPort("10.96.0.12:53") // DNATed to 127.0.0.1:5354, no longer one
			sendUDP(b, ns, live, 10_000, 10_000-stale)
			st := model.NewState()
			for i, svc := range []netip.AddrPort{live, doomed} {
				name := model.ServicePortName{Namespace: "bench", Name: fmt.Sprint("svc", i), Port: "dns"}
				st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.UDP, Port: svc.Port(),
					ClusterIPs: []netip.Addr{svc.Addr()}})
			}
			st.Endpoints = st.Endpoints.With(model.ServicePortName{Namespace: "bench", Name: "svc0", Port: "dns"}, []model.Endpoint{
				{Addr: netip.MustParseAddr("127.0.0.1"), Port: 5353, Ready: true, Serving: true}})
			c := &Cleaner{Table: dialIn(b, ns), FullEvery: time.Nanosecond,
				LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				sendUDP(b, ns, doomed, 30_000, stale)
				b.StartTimer()
				res, err := c.Clean(st)
				if err != nil {
					b.Fatal(err)
				}
				if res.Deleted != stale || res.Flows < 10_000 {
					b.Fatalf("read %d, deleted %d; want 10000 and %d", res.Flows, res.Deleted, stale)
				}
			}
		})
	}
}
