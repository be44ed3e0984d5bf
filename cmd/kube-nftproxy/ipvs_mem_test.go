package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/source/apisource"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// TestIPVSMemory is IPVS mode's memory at scale, as TestProxyMemory is
// nftables mode's: KNP_MEM_IPVS_SERVICES Services x 10 endpoints through
// the informers and the Builder, then the IPVS backend's first sync, a
// second one, a drift check (the periodic read-back of IPVS) and a sync
// after it. The helper tables are real nftables in a network namespace of
// their own (kube-ipvs0's addresses in memory: the host has no dummy
// links); IPVS is a kernel that keeps nothing (ipvsnl.Conn holds no copy),
// whose read-back returns what was applied, as a fresh slice, as Conn's
// does. It logs the live heap after each stage and the peak RSS, and
// writes heap profiles to KNP_MEM_PROFILES if set. One size per process.
func TestIPVSMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KNP_MEM_IPVS_SERVICES"))
	if n == 0 {
		t.Skip("set KNP_MEM_IPVS_SERVICES (e.g. 10000) to measure IPVS mode's memory at that size")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and nftables")
	}
	profiles := os.Getenv("KNP_MEM_PROFILES")
	const perService, node = 10, "node-1"
	client := memClient(n, perService, node)
	ns := testns.New(t, "knp-ipvsmem-")
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	kernel := &recordingKernel{}
	stage := heapStages(t, profiles, n)
	be := ipvs.NewBackend(kernel, ipvs.BackendConfig{
		Plan:      ipvs.Config{Scheduler: "rr"},
		NodeAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("10.0.2.15")}, nil },
		NewHelper: func(node model.Node) (ipvs.Helper, error) {
			h := ipvs.NewNftHelper(k, nft.DefaultConfig().Settings, node, &memLink{addrs: map[netip.Addr]bool{}})
			return &profiledHelper{NftHelper: h, stage: func() { stage("helper-apply") }}, nil
		},
		// Every sync after the first checks IPVS and the helper tables.
		CheckEvery: time.Nanosecond,
	})

	stage("start")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b := kube.NewBuilder(node)
	ready := make(chan struct{})
	src := &apisource.APISource{Client: client, Builder: b, OnReady: func() { close(ready) }}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("API source stopped: %v", err)
	case <-time.After(5 * time.Minute):
		t.Fatal("caches did not fill")
	}
	stage("informers")
	st := b.State()
	stage("state")
	t0 := time.Now()
	res, err := be.Sync(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full sync: %v, %d messages", time.Since(t0).Round(time.Millisecond), res.Messages)
	stage("full-sync")
	// The periodic check: IPVS and the helper tables read back whole
	// and compared, then the same State synced again.
	kernel.applied = be.Plan()
	t0 = time.Now()
	if _, err := be.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	t.Logf("checked sync: %v", time.Since(t0).Round(time.Millisecond))
	kernel.applied = nil
	stage("checked-sync")
	cancel()
	<-done
	runtime.KeepAlive(b)
	runtime.KeepAlive(be)
}

// heapStages returns a function that logs, for the stage that just ended,
// the heap's sampled high-water marks since the last call and then the
// live heap and peak RSS, and writes a heap profile into dir if set.
func heapStages(t *testing.T, dir string, n int) func(name string) {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	var mu sync.Mutex
	peaks := make([]uint64, len(samples))
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.Context().Done():
				return
			case <-tick.C:
			}
			metrics.Read(samples)
			mu.Lock()
			for i, s := range samples {
				peaks[i] = max(peaks[i], s.Value.Uint64())
			}
			mu.Unlock()
		}
	}()
	return func(name string) {
		mu.Lock()
		t.Logf("%-22s max live at a GC %6.1f MiB  max goal %6.1f MiB  max objects %6.1f MiB", "  until "+name, mib(peaks[0]), mib(peaks[1]), mib(peaks[2]))
		clear(peaks)
		mu.Unlock()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("%-22s heap in use %6.1f MiB  heap sys %6.1f MiB  sys %6.1f MiB  peak RSS %6.1f MiB",
			name, mib(ms.HeapInuse), mib(ms.HeapSys), mib(ms.Sys), peakRSS(t))
		if dir != "" {
			writeHeapProfile(t, filepath.Join(dir, fmt.Sprintf("ipvs-heap-%d-%s.pprof", n, name)))
		}
	}
}

// recordingKernel is an IPVS table that keeps nothing: every command
// applies, and Read returns applied (what the test says the kernel holds).
type recordingKernel struct {
	applied *ipvs.Plan
	ops     int
}

// Read returns a fresh copy of the plan's virtual servers, as Conn.Read
// allocates what it parses.
func (k *recordingKernel) Read() ([]ipvsnl.VirtualServer, error) {
	if k.applied == nil {
		return nil, nil
	}
	vss := k.applied.VirtualServers()
	for i := range vss {
		vss[i].Dests = slices.Clone(vss[i].Dests)
	}
	return vss, nil
}

func (k *recordingKernel) Dests(ipvsnl.ServiceKey) ([]ipvsnl.Dest, error) { return nil, nil }

func (k *recordingKernel) Apply(ops []ipvsnl.Op) ([]error, error) {
	k.ops += len(ops)
	return nil, nil
}

// memLink holds kube-ipvs0's addresses in memory.
type memLink struct{ addrs map[netip.Addr]bool }

func (l *memLink) Addrs() ([]netip.Addr, error) {
	var out []netip.Addr
	for a := range l.addrs {
		out = append(out, a)
	}
	return out, nil
}

func (l *memLink) AddAddrs(as []netip.Addr) error {
	for _, a := range as {
		l.addrs[a] = true
	}
	return nil
}

func (l *memLink) DelAddrs(as []netip.Addr) error {
	for _, a := range as {
		delete(l.addrs, a)
	}
	return nil
}

// profiledHelper takes a stage (heap figures, a profile) before the first
// Apply: the full sync's peak, with its commands sent and the helper's
// change in hand.
type profiledHelper struct {
	*ipvs.NftHelper
	stage func()
	done  bool
}

func (h *profiledHelper) Apply(c ipvs.HelperChange) error {
	if !h.done {
		h.done = true
		h.stage()
	}
	return h.NftHelper.Apply(c)
}
