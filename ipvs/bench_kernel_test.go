package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// BenchmarkKernel measures ipvsnl.Conn and the Syncer against the kernel in the
// VM, each configuration in a fresh network namespace (IPVS's trash of
// deleted real servers is per netns, so earlier configurations do not slow
// later ones through it; their teardown still runs in the background):
//
//	hack/vm/run.sh ./ipvs -run '^$' -bench BenchmarkKernel -benchtime 1x
//
// apply-N: N services x 10 real servers (N x 11 commands) in batched
// writes; read-N: Read of that table (one dump + /proc/net/ip_vs);
// set-dest-N: one real server's weight changed, one Apply each;
// sync-N: the Syncer's first sync of N ClusterIP services x 10 endpoints,
// then one endpoint added (one command) and one removed (weight 0, a
// count read, the delete) among them (the Planner's time for the first shown apart).
func BenchmarkKernel(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("apply-%dx10", n), func(b *testing.B) {
			var c *ipvsnl.Conn
			var ops []ipvsnl.Op
			for range b.N {
				b.StopTimer()
				c, _ = ipvsnltest.DialNew(b)
				ops = ipvsnltest.CreateOps(benchTable(n))
				b.StartTimer()
				ipvsnltest.MustApply(b, c, ops)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/apply")
			b.ReportMetric(float64(len(ops)), "cmds")

			// The same table read back, and single changes.
			t0 := time.Now()
			vss, err := c.Read()
			if err != nil || len(vss) != n {
				b.Fatalf("read %d services, %v", len(vss), err)
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "ms/read")
			v := benchTable(n)[n/2]
			const changes = 200
			t0 = time.Now()
			for i := range changes {
				d := v.Dests[i%10]
				d.Weight = uint32(2 + i%2)
				ipvsnltest.MustApply(b, c, []ipvsnl.Op{{Cmd: ipvsnl.CmdSetDest, Service: v.Service, Dest: d}})
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/changes, "us/set-dest")
		})
		b.Run(fmt.Sprintf("sync-%dx10", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				c, _ := ipvsnltest.DialNew(b)
				st := model.NewState()
				st.Node = model.Node{Name: node}
				for i := range n {
					name := spn("bulk", fmt.Sprintf("s%d", i), "")
					st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80,
						ClusterIPs: []netip.Addr{benchVIP(i)}})
					for j := range 10 {
						st.Endpoints = st.Endpoints.With(name, append(st.Endpoints.Get(name), ready(benchRS(i, j).Addr().String(), 8080, "b")))
					}
				}
				pl := NewPlanner(Config{})
				p := pl.Plan(st, nil)
				s := NewSyncer(c, NewFakeHelper(), SyncConfig{})
				b.StartTimer()
				t0 := time.Now()
				if _, err := s.Sync(p); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "ms/full-sync")
				b.StopTimer()
				// One endpoint added: one NEW_DEST.
				name := spn("bulk", fmt.Sprintf("s%d", n/2), "")
				next := clone(st)
				next.Endpoints = next.Endpoints.With(name, append(slices.Clone(st.Endpoints.Get(name)), ready("10.200.0.1", 8080, "b")))
				t0 = time.Now()
				p = pl.Plan(next, nil)
				b.ReportMetric(float64(time.Since(t0).Microseconds()), "us/plan-add-one")
				t0 = time.Now()
				res, err := s.Sync(p)
				if err != nil || res.Ops != 1 || res.Writes != 1 {
					b.Fatalf("one endpoint added: %+v, %v", res, err)
				}
				b.ReportMetric(float64(time.Since(t0).Microseconds()), "us/sync-add-one")
				// One TCP endpoint removed: weight 0, its connection
				// count read (none), deleted.
				next2 := clone(next)
				next2.Endpoints = next2.Endpoints.With(name, next.Endpoints.Get(name)[1:])
				p = pl.Plan(next2, nil)
				t0 = time.Now()
				res, err = s.Sync(p)
				if err != nil || res.Ops != 2 || res.DestReads != 1 || res.Draining != 0 {
					b.Fatalf("one endpoint removed: %+v, %v", res, err)
				}
				b.ReportMetric(float64(time.Since(t0).Microseconds()), "us/sync-remove-one")
			}
		})
	}
}

func benchVIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}) }
func benchRS(i, j int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)}), 8080)
}

// benchTable: n TCP services of 10 real servers each.
func benchTable(n int) []ipvsnl.VirtualServer {
	vss := make([]ipvsnl.VirtualServer, n)
	for i := range vss {
		vss[i].Service = ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: benchVIP(i), Protocol: model.TCP, Port: 80}, Scheduler: "rr", Netmask: 0xffffffff}
		for j := range 10 {
			vss[i].Dests = append(vss[i].Dests, ipvsnl.Dest{Addr: benchRS(i, j), Weight: 1})
		}
	}
	return vss
}
