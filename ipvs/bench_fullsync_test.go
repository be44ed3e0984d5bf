package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// discardKernel and discardHelper apply everything and hold nothing: what
// is left of a sync is the backend's own work (plan, diff, bookkeeping).
type discardKernel struct{}

func (discardKernel) Read() ([]ipvsnl.VirtualServer, error)          { return nil, nil }
func (discardKernel) Dests(ipvsnl.ServiceKey) ([]ipvsnl.Dest, error) { return nil, nil }
func (discardKernel) Apply(ops []ipvsnl.Op) ([]error, error)         { return nil, nil }
func (discardHelper) Read() ([]netip.Addr, []Element, error)         { return nil, nil, nil }
func (discardHelper) Apply(HelperChange) error                       { return nil }

type discardHelper struct{}

// The userspace side of a full first sync: plan, diff and bookkeeping for
// N Services x 10 local endpoints, over a kernel and helper that keep
// nothing. B/op and allocs/op are the sync's garbage and what it keeps.
func BenchmarkBackendFullSyncUserspace(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%dx10", n), func(b *testing.B) {
			st := bulkState10(n, demoState().Node.Name)
			st.Changes = model.StateChanges{Lineage: &model.Lineage{}, Gen: 1, NodeChanged: true}
			b.ReportAllocs()
			for b.Loop() {
				be := NewBackend(discardKernel{}, BackendConfig{
					NodeAddrs: func() ([]netip.Addr, error) { return nodeAddrs, nil },
					NewHelper: func(model.Node) (Helper, error) { return discardHelper{}, nil },
				})
				if _, err := be.Sync(context.Background(), st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
