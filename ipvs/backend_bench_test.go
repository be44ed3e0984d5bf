package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// The userspace side of a one-endpoint change (plan, diff, ops and
// helper elements) over a fake kernel and helper, at sizes, with the
// State's changes as the API source's Builder sets them: it must not grow with
// the number of Services (the kernel's part is in the VM benchmarks).
// bulkState10 is bulkState with ten endpoints (on node) per bulk Service,
// each its own address.
func bulkState10(n int, node string) *model.State {
	st := bulkState(n)
	k := 0
	for name := range st.Services.Keys() {
		if name.Namespace != "bulk" {
			continue
		}
		eps := make([]model.Endpoint, 10)
		for j := range eps {
			eps[j] = ready(netip.AddrFrom4([4]byte{100, 64 + byte(k>>16), byte(k >> 8), byte(k)}).String(), 8080, node)
			k++
		}
		st.Endpoints = st.Endpoints.With(name, eps)
	}
	return st
}

func BenchmarkBackendOneEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 5000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := bulkState10(n, "b")
			be := NewBackend(ipvsnl.NewFakeKernel(), BackendConfig{
				NodeAddrs: func() ([]netip.Addr, error) { return nodeAddrs, nil },
				NewHelper: func(model.Node) (Helper, error) { return NewFakeHelper(), nil },
			})
			lin := &model.Lineage{}
			st.Changes = model.StateChanges{Lineage: lin, Gen: 1, NodeChanged: true}
			if _, err := be.Sync(context.Background(), st); err != nil {
				b.Fatal(err)
			}
			name := spn("bulk", "s0", "")
			orig := st.Endpoints.Get(name)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				// Like the informers: a new State sharing every unchanged
				// Service's objects, one endpoint list replaced.
				next := &model.State{Node: st.Node, Services: st.Services, Endpoints: st.Endpoints}
				eps := append([]model.Endpoint(nil), orig...)
				eps[0] = ready(netip.AddrFrom4([4]byte{100, 127, byte(i >> 8), byte(i)}).String(), 8080, "b")
				next.Endpoints = next.Endpoints.With(name, eps)
				next.Changes = model.StateChanges{Lineage: lin, Gen: uint64(i) + 2, Ports: []model.ServicePortName{name}}
				b.StartTimer()
				if _, err := be.Sync(context.Background(), next); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
			}
		})
	}
}
