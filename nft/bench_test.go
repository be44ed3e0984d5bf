package nft

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// scaleState is n ClusterIP+NodePort services with m endpoints each.
func scaleState(n, m int) *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	services, endpoints := st.Services.Edit(), st.Endpoints.Edit()
	for i := 0; i < n; i++ {
		name := model.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), Port: "p"}
		ip := netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})
		svc := &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, ClusterIPs: []netip.Addr{ip}}
		if i < 2000 { // the NodePort range holds 2768
			svc.NodePort = uint16(30000 + i)
		}
		services.Set(name, svc)
		eps := make([]model.Endpoint, m)
		for j := range eps {
			eps[j] = model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 128 + byte(i>>14), byte(i >> 6), byte(i&63)<<2 | byte(j&3)}),
				Port: uint16(8000 + j), NodeName: "node-1", Ready: true, Serving: true}
		}
		endpoints.Set(name, eps)
	}
	st.Services, st.Endpoints = services.Map(), endpoints.Map()
	return st
}

// shallowCopy returns a State sharing st's service ports and endpoint lists.
func shallowCopy(st *model.State) *model.State {
	out := model.NewState()
	out.Node = st.Node
	out.Services = st.Services
	out.Endpoints = st.Endpoints
	return out
}

// withOneEndpointChanged returns a copy of st sharing every service and
// endpoint list but one, whose first endpoint moved. When st has a lineage
// (as a Builder's States do), the copy is its State generation gen+1, with
// Changes naming that service port.
func withOneEndpointChanged(st *model.State, gen int) *model.State {
	out := shallowCopy(st)
	name := model.ServicePortName{Namespace: "ns", Name: "svc-7", Port: "p"}
	eps := append([]model.Endpoint(nil), st.Endpoints.Get(name)...)
	eps[0].Addr = netip.AddrFrom4([4]byte{10, 250, byte(gen >> 8), byte(gen)})
	out.Endpoints = out.Endpoints.With(name, eps)
	if st.Changes.Lineage != nil {
		out.Changes = model.StateChanges{Lineage: st.Changes.Lineage, Gen: st.Changes.Gen + uint64(gen), Ports: []model.ServicePortName{name}}
	}
	return out
}

// withLineage makes st State generation 1 of a source's, as the
// Builder's first.
func withLineage(st *model.State) *model.State {
	st.Changes = model.StateChanges{Lineage: &model.Lineage{}, Gen: 1, NodeChanged: true}
	return st
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		st := scaleState(n, 10)
		b.Run(fmt.Sprintf("services=%d/endpoints=10", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Build(st, demoConfig())
			}
		})
	}
}

// BenchmarkFullSyncUserspace times what a full sync does besides the
// kernel's part, for n services x 10 endpoints: building every table,
// planning the transaction and encoding it (the critical path, on all
// CPUs), with the bytes and messages it makes.
func BenchmarkFullSyncUserspace(b *testing.B) {
	for _, n := range benchSizes(b, 1000, 5000, 10000) {
		st := scaleState(n, 10)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			be, err := NewBackend(nil, BackendConfig{Rules: demoConfig()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				want := map[tableID]*nftlib.Table{}
				for _, id := range tableIDs() {
					want[id] = BuildTable(id.f, be.cfg, st.Node, id.kind)
				}
				placeAll(want, be.cfg, st, st.Node, homeKind)
				var unsent nftlib.Kernel // encodes, sends nothing
				bt := unsent.NewTx()
				var setID uint32
				for _, id := range tableIDs() {
					x, _ := nftlib.FullTx(want[id], &nftlib.KernelTable{}, false)
					x.Write(bt, &setID)
				}
				b.ReportMetric(float64(bt.Messages()), "msgs")
				unsent.DiscardTx(bt)
			}
		})
	}
}

// BenchmarkKernelFullSync times a first (full) sync of n services x 10
// endpoints into an empty network namespace, transaction included; with
// the drift check's change monitor listening (as the proxy runs) and
// without, since the kernel builds its notifications for every commit.
//
// Besides ns/op it reports the kernel's part (kernel-ms: the transaction's
// sendmsg to its ack), the whole sync over it (x-kernel), the phases of
// the last sync (build-ms, diff-ms, encode-ms), the settling transaction
// that follows it, outside the sync as in the proxy (settle-ms), and the
// heap the backend keeps once the sync is done (heap-MiB, live after a GC).
func BenchmarkKernelFullSync(b *testing.B) {
	for _, n := range benchSizes(b, 1000, 5000, 10000) {
		st := scaleState(n, 10)
		for _, monitor := range []bool{false, true} {
			b.Run(fmt.Sprintf("services=%d/monitor=%v", n, monitor), func(b *testing.B) {
				benchFullSync(b, st, monitor)
			})
		}
	}
}

func benchFullSync(b *testing.B, st *model.State, monitor bool) {
	for b.Loop() {
		b.StopTimer()
		// Each iteration in a namespace of its own, deleted before the
		// next one: earlier namespaces full of rules (and their teardown)
		// would slow the later iterations.
		ns := testns.New(b, "knp-nft-")
		k, err := nftlib.OpenKernel(testns.Path(ns))
		if err != nil {
			b.Fatal(err)
		}
		phases := &phaseCapture{}
		// As the proxy runs: the settling transaction after the loop
		// reports the sync (timed apart, as settle-ms).
		bc := BackendConfig{Rules: demoConfig(), Log: slog.New(phases), Strategy: Strategy{DeferSettle: true}}
		if monitor {
			bc.CheckEvery = time.Hour // opens the monitor at the first Sync
		}
		be, err := NewBackend(k, bc)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := be.Sync(context.Background(), st)
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		settleStart := time.Now()
		be.Settle()
		b.ReportMetric(time.Since(settleStart).Seconds()*1000, "settle-ms")
		b.ReportMetric(liveHeapMiB(), "heap-MiB")
		runtime.KeepAlive(be)
		k.Close()
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			b.Fatalf("ip netns del %s: %v: %s", ns, err, out)
		}
		b.StartTimer()
		b.ReportMetric(float64(res.Messages), "msgs")
		b.ReportMetric(float64(res.Bytes)/(1<<20), "MiB")
		b.ReportMetric(res.Kernel.Seconds()*1000, "kernel-ms")
		b.ReportMetric(took.Seconds()/res.Kernel.Seconds(), "x-kernel")
		phases.report(b)
	}
}

// liveHeapMiB is the heap still reachable after a collection.
func liveHeapMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// benchSizes are the numbers of Services a scale benchmark runs at: def,
// or those of KNP_BENCH_SIZES (e.g. "1000,50000").
func benchSizes(tb testing.TB, def ...int) []int {
	spec := os.Getenv("KNP_BENCH_SIZES")
	if spec == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			tb.Fatalf("KNP_BENCH_SIZES: %q is not a list of counts", spec)
		}
		out = append(out, n)
	}
	return out
}

// withAffinity gives session affinity to the service ports pick selects.
func withAffinity(st *model.State, pick func(name model.ServicePortName) bool) {
	for name, svc := range st.Services.All() {
		if pick(name) {
			svc := *svc
			svc.AffinityTimeout = 10800 * time.Second
			st.Services = st.Services.With(name, &svc)
		}
	}
}

// benchChanges programs st, then times syncs that each move one endpoint
// of svc-7 (with the caches evicted first when cold), and reports the
// medians of the whole sync and of its kernel part.
func benchChanges(b *testing.B, st *model.State, cold bool) {
	benchChangesWith(b, st, cold, false)
}

// benchChangesWith is benchChanges, with the drift check's change monitor
// listening when monitor is set (as the proxy runs): small transactions are
// sent with it in the notification group, so the kernel builds their
// notifications.
func benchChangesWith(b *testing.B, st *model.State, cold, monitor bool) {
	benchSteps(b, st, cold, monitor, func(_ *model.State, gen int) *model.State {
		return withOneEndpointChanged(st, gen)
	})
}

// benchSteps programs st, then times the syncs of the States step makes,
// each from the one before (st first) and its number from 1.
func benchSteps(b *testing.B, st *model.State, cold, monitor bool, step func(prev *model.State, gen int) *model.State) {
	ns := testns.New(b, "knp-nft-")
	bc := BackendConfig{Rules: demoConfig()}
	if monitor {
		bc.CheckEvery = time.Hour // the monitor opens at the first Sync
	}
	be := openTestBackendWith(b, ns, bc)
	if _, err := be.Sync(context.Background(), st); err != nil {
		b.Fatal(err)
	}
	// Each change comes at least --iptables-min-sync-period (1s) after the
	// last, so it deletes the chains the last one emptied, as in the proxy.
	advance := fakeClock(be)
	gen := 0
	var kernel, total []time.Duration
	for b.Loop() {
		gen++
		b.StopTimer()
		advance(staleChainAge)
		st = step(st, gen)
		if cold {
			evictCaches()
		}
		b.StartTimer()
		start := time.Now()
		res, err := be.Sync(context.Background(), st)
		total = append(total, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if res.Full {
			b.Fatal("a one-Service change made a full sync")
		}
		kernel = append(kernel, res.Kernel)
		b.ReportMetric(float64(res.Messages), "msgs")
	}
	// Medians: this VM's kernel times are noisy, the mean hides the
	// typical case.
	b.ReportMetric(median(total).Seconds()*1000, "median-ms")
	b.ReportMetric(median(kernel).Seconds()*1000, "kernel-median-ms")
}

// BenchmarkKernelAffinity times the full sync of n Services x 10 endpoints
// that all have session affinity (one dynamic set per table, whatever n:
// linear), and a one-endpoint change among them (all in the affinity table,
// which a change validates whole).
func BenchmarkKernelAffinity(b *testing.B) {
	for _, n := range []int{1000, 2000} {
		st := scaleState(n, 10)
		withAffinity(st, func(model.ServicePortName) bool { return true })
		b.Run(fmt.Sprintf("full/services=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ns := testns.New(b, "knp-nft-")
				be := openTestBackend(b, ns, demoConfig())
				b.StartTimer()
				res, err := be.Sync(context.Background(), st)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(res.Kernel.Seconds()*1000, "kernel-ms")
			}
		})
		b.Run(fmt.Sprintf("change/services=%d", n), func(b *testing.B) { benchChanges(b, st, false) })
	}
}

// BenchmarkKernelAffinityMixed times a one-endpoint change of a Service
// without affinity (svc-7) while every tenth of 5k Services has it: the
// affinity table is not touched, so the change costs what it does without.
func BenchmarkKernelAffinityMixed(b *testing.B) {
	st := scaleState(5000, 10)
	withAffinity(st, func(name model.ServicePortName) bool {
		var i int
		fmt.Sscanf(name.Name, "svc-%d", &i)
		return i%10 == 0
	})
	benchChanges(b, st, false)
}

// BenchmarkKernelOneEndpointChange times a sync that moves one endpoint of
// one service while n services are programmed: with the States naming
// their changes (changes=true, as the Builder's do: only the changed
// service port is looked at) and without (every service port compared by
// pointer).
func BenchmarkKernelOneEndpointChange(b *testing.B) {
	for _, n := range benchSizes(b, 1000, 5000, 10000) {
		for _, cache := range []string{"warm", "cold"} {
			for _, monitor := range []bool{false, true} {
				for _, changes := range []bool{true, false} {
					b.Run(fmt.Sprintf("services=%d/cache=%s/monitor=%v/changes=%v", n, cache, monitor, changes), func(b *testing.B) {
						st := scaleState(n, 10)
						if changes {
							withLineage(st)
						}
						benchChangesWith(b, st, cache == "cold", monitor)
					})
				}
			}
		}
	}
}

// BenchmarkKernelServiceAdded times the sync that programs one new Service
// (one endpoint, as make bench-scale adds) while n services x 10 endpoints
// are programmed, each added on top of the ones before.
func BenchmarkKernelServiceAdded(b *testing.B) {
	for _, n := range benchSizes(b, 1000, 5000, 10000) {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			benchSteps(b, withLineage(scaleState(n, 10)), false, true, withServiceAdded)
		})
	}
}

// withServiceAdded returns a copy of prev with one more Service, the
// gen-th added, as the next State generation of prev's lineage.
func withServiceAdded(prev *model.State, gen int) *model.State {
	out := shallowCopy(prev)
	name := model.ServicePortName{Namespace: "added", Name: fmt.Sprintf("svc-%d", gen), Port: "p"}
	out.Services = out.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 200, byte(gen >> 8), byte(gen)})}})
	out.Endpoints = out.Endpoints.With(name, []model.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 201, byte(gen >> 8), byte(gen)}),
		Port: 8080, NodeName: "node-1", Ready: true, Serving: true}})
	out.Changes = model.StateChanges{Lineage: prev.Changes.Lineage, Gen: prev.Changes.Gen + 1, Ports: []model.ServicePortName{name}}
	return out
}

// evictBuf is larger than this machine's caches.
var evictBuf = make([]byte, 64<<20)

// evictCaches writes over evictBuf, pushing the kernel's ruleset out of the
// CPU caches, as the proxy's other work (informers, building, GC) does
// between two syncs on a real node. A commit walks every chain of the
// namespace (see BenchmarkKernelCommitFloor), and with cold caches that
// walk, not the change, is most of a small sync.
func evictCaches() {
	for i := 0; i < len(evictBuf); i += 64 {
		evictBuf[i]++
	}
}

// BenchmarkKernelCommitFloor times the smallest transaction (add or delete
// one empty chain) while n services are programmed: what the kernel costs
// for any commit, whoever sends it. Each commit walks every chain of every
// table in the namespace.
func BenchmarkKernelCommitFloor(b *testing.B) {
	for _, n := range append([]int{0}, benchSizes(b, 1000, 5000, 10000)...) {
		for _, cache := range []string{"warm", "cold"} {
			b.Run(fmt.Sprintf("services=%d/cache=%s", n, cache), func(b *testing.B) {
				ns := testns.New(b, "knp-nft-")
				be := openTestBackend(b, ns, demoConfig())
				if _, err := be.Sync(context.Background(), scaleState(n, 10)); err != nil {
					b.Fatal(err)
				}
				add := true
				var took []time.Duration
				for b.Loop() {
					bt := be.kern().NewTx()
					if add {
						bt.AddChains(nftlib.IPv4, DefaultTableName+deltaSuffix, []*nftlib.Chain{{Name: "floor"}})
					} else {
						bt.DelChain(nftlib.IPv4, DefaultTableName+deltaSuffix, "floor")
					}
					add = !add
					if cache == "cold" {
						b.StopTimer()
						evictCaches()
						b.StartTimer()
					}
					start := time.Now()
					if err := be.kern().CommitTx(bt); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				b.ReportMetric(median(took).Seconds()*1000, "median-ms")
			})
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkKernelDriftCheck times the drift check with n Services x 10
// endpoints programmed: "generation" when only our transactions committed
// (one GETGEN), "foreign-commits" when another process committed to its own
// table before each check (the monitor marks nothing: nothing read back),
// "<what>-repair" a sync after another process changed our main table as
// repairCases does (what the monitor names read back and repaired in
// place; the table deleted, a full sync), "readback-all" when every table is read back (lost events, or no
// monitor) and compared: metadata, rules, elements.
func BenchmarkKernelDriftCheck(b *testing.B) {
	for _, n := range []int{1000, 5000, 10000} {
		ns := testns.New(b, "knp-nft-")
		be := openTestBackendWith(b, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
		st := scaleState(n, 10)
		for i := 0; i < 2; i++ { // program, then verify
			if _, err := be.Sync(context.Background(), st); err != nil {
				b.Fatal(err)
			}
		}
		mon := monitorOf(b, be)
		w := newForeignWriter(b, ns, nftlib.IPv4, "other")
		b.Run(fmt.Sprintf("services=%d/generation", n), func(b *testing.B) {
			for b.Loop() {
				if be.drifted() {
					b.Fatal("drift")
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/foreign-commits", n), func(b *testing.B) {
			reads := be.kern().readBacks
			for b.Loop() {
				b.StopTimer()
				w.commit(b, 1)
				b.StartTimer()
				if be.drifted() {
					b.Fatal("drift")
				}
			}
			if be.kern().readBacks != reads {
				b.Fatalf("%d tables read back", be.kern().readBacks-reads)
			}
		})
		elem := testns.NFT(b, ns, "-a", "list", "map", "ip", DefaultTableName, "service-ips")
		for _, tc := range repairCases(firstServiceIPsKey(b, elem)) {
			b.Run(fmt.Sprintf("services=%d/%s-repair", n, tc.name), func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					testns.NFTScript(b, ns, tc.tamper)
					testutil.WaitFor(b, 10*time.Second, "the monitor to see the change", mon.Pending)
					b.StartTimer()
					res, err := be.Sync(context.Background(), st)
					if err != nil || res.Full != tc.full || !res.Changed {
						b.Fatalf("repair: full %v, changed %v, err %v; want full %v", res.Full, res.Changed, err, tc.full)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("services=%d/readback-all", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				be.check.readAll, be.check.verified = true, false
				if be.drifted() {
					b.Fatal("drift")
				}
			}
		})
	}
}

// repairCase is a change another process makes to our main table, which
// the sync repairs in place, or with a full sync (full).
type repairCase struct {
	name, tamper string
	full         bool
}

// repairCases are the repairCase of the benchmarks: key is an element of
// service-ips.
func repairCases(key string) []repairCase {
	const tbl = "ip " + DefaultTableName + " "
	return []repairCase{
		{name: "rule", tamper: "insert rule " + tbl + "KUBE-SERVICES drop\n"},
		{name: "element", tamper: "delete element " + tbl + "service-ips { " + key + " }\n"},
		{name: "chain", tamper: "add chain " + tbl + "rogue { type filter hook input priority 0; policy drop; }\n"},
		{name: "object", tamper: "add counter " + tbl + "rogue\ninsert rule " + tbl + "KUBE-SERVICES counter name rogue\n"},
		{name: "table", tamper: "delete table " + tbl + "\n", full: true},
	}
}

// firstServiceIPsKey is the key of the first element nft lists of the
// service-ips map, in nft's syntax ("10.96.0.1 . tcp . 80").
func firstServiceIPsKey(b testing.TB, listing string) string {
	b.Helper()
	_, after, ok := strings.Cut(listing, "elements = { ")
	if !ok {
		b.Fatalf("no elements in:\n%s", listing)
	}
	key, _, ok := strings.Cut(after, " comment")
	if !ok {
		b.Fatalf("no element comment in:\n%s", after[:min(len(after), 200)])
	}
	return key
}

// foreignWriter commits to a table of its own in the namespace, through
// another netlink socket than the backend's (another port id), as kubelet,
// a CNI plugin or firewalld would.
type foreignWriter struct {
	k     *nftlib.Kernel
	f     nftlib.Family
	table string
	n     int
}

func newForeignWriter(t testing.TB, ns string, f nftlib.Family, table string) *foreignWriter {
	t.Helper()
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	w := &foreignWriter{k: k, f: f, table: table}
	bt := k.NewTx()
	bt.AddTable(f, table, "")
	if err := k.CommitTx(bt); err != nil {
		t.Fatal(err)
	}
	return w
}

// commit adds chains chains in one transaction.
func (w *foreignWriter) commit(t testing.TB, chains int) {
	t.Helper()
	bt := w.k.NewTx()
	for i := 0; i < chains; i++ {
		w.n++
		bt.AddChains(w.f, w.table, []*nftlib.Chain{{Name: fmt.Sprintf("c%d", w.n)}})
	}
	if err := w.k.CommitTx(bt); err != nil {
		t.Fatal(err)
	}
}
