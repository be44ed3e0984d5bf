package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// timedKernel and timedHelper add up the time spent in each phase of a sync.
type timedKernel struct {
	ipvsnl.Kernel
	took time.Duration
}

func (k *timedKernel) Apply(ops []ipvsnl.Op) ([]error, error) {
	t0 := time.Now()
	defer func() { k.took += time.Since(t0) }()
	return k.Kernel.Apply(ops)
}

type timedHelper struct {
	Helper
	took time.Duration
}

func (h *timedHelper) Apply(c HelperChange) error {
	t0 := time.Now()
	defer func() { h.took += time.Since(t0) }()
	return h.Helper.Apply(c)
}

// A full first sync of the real backend (IPVS, kube-ipvs0, helper tables)
// in a fresh namespace at sizes, with where the time goes. Real IPVS: the
// VM tier (hack/vm/run.sh ./ipvs -run '^$' -bench BenchmarkKernelBackendFullSync -benchtime 1x).
func BenchmarkKernelBackendFullSync(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("services=%dx10", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				ns := testns.New(b, "knp-ipvs-")
				// IPVS refuses IPv4 real servers until the namespace has a
				// local routing table: a node's loopback is up.
				if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				c := ipvsnltest.Dial(b, "/run/netns/"+ns)
				nk, err := nftlib.OpenKernel(testns.Path(ns))
				if err != nil {
					b.Fatal(err)
				}
				link, err := ipvsnl.OpenDummy(testns.Path(ns))
				if err != nil {
					b.Fatal(err)
				}
				st := bulkState10(n, demoState().Node.Name)
				lin := &model.Lineage{}
				st.Changes = model.StateChanges{Lineage: lin, Gen: 1, NodeChanged: true}
				tk := &timedKernel{Kernel: c}
				var th *timedHelper
				var addrsTook time.Duration
				be := NewBackend(tk, BackendConfig{
					NodeAddrs: func() (addrs []netip.Addr, err error) {
						t0 := time.Now()
						defer func() { addrsTook += time.Since(t0) }()
						err = netns.Do("/run/netns/"+ns, func() error {
							addrs, err = netns.AddrsExcept(ipvsnl.DummyName)
							return err
						})
						return addrs, err
					},
					NewHelper: func(node model.Node) (Helper, error) {
						th = &timedHelper{Helper: NewNftHelper(nk, proxier.Settings{}, node, link)}
						return th, nil
					},
				})
				b.StartTimer()
				t0 := time.Now()
				if _, err := be.Sync(context.Background(), st); err != nil {
					b.Fatal(err)
				}
				total := time.Since(t0)
				b.StopTimer()
				b.Logf("%d services x 10: sync %v: IPVS commands %v, kube-ipvs0 and helper tables %v, the rest (plan, diff, reads) %v",
					n, total.Round(time.Millisecond), tk.took.Round(time.Millisecond), th.took.Round(time.Millisecond),
					(total - tk.took - th.took).Round(time.Millisecond))
				// Then one endpoint changed, ten times, as the API source's
				// States name it (StateChanges).
				name := spn("bulk", "s0", "")
				for i := range 10 {
					next := &model.State{Node: st.Node, Services: st.Services, Endpoints: st.Endpoints,
						Changes: model.StateChanges{Lineage: lin, Gen: uint64(i) + 2, Ports: []model.ServicePortName{name}}}
					eps := slices.Clone(st.Endpoints.Get(name))
					eps[0] = ready(netip.AddrFrom4([4]byte{100, 127, 0, byte(i)}).String(), 8080, "b")
					next.Endpoints = next.Endpoints.With(name, eps)
					tk.took, th.took, addrsTook = 0, 0, 0
					t0 := time.Now()
					if _, err := be.Sync(context.Background(), next); err != nil {
						b.Fatal(err)
					}
					took := time.Since(t0)
					b.Logf("one endpoint changed: %v: IPVS commands %v, helper %v, node addresses %v, the rest %v", took.Round(10*time.Microsecond),
						tk.took.Round(10*time.Microsecond), th.took.Round(10*time.Microsecond), addrsTook.Round(10*time.Microsecond),
						(took - tk.took - th.took - addrsTook).Round(10*time.Microsecond))
					st = next
				}
				nk.Close()
				link.Close()
				b.StartTimer()
			}
		})
	}
}
