package leftover

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// watchedWatcher runs a Watcher in a fresh namespace, following the change
// monitor of a Kernel there as the proxy's does (it watches a table of
// ours), and counts its looks. every is its CheckEvery.
func watchedWatcher(t *testing.T, every time.Duration) (ns string, closeKernel func(), looks *atomic.Int64, cleans *atomic.Int64) {
	t.Helper()
	ns = testns.New(t, "knp-leftw-")
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeKernel = func() { once.Do(func() { k.Close() }) }
	t.Cleanup(closeKernel)
	if err := k.Watch([]nftlib.TableRef{{Family: nftlib.IPv4, Name: "kube-nftproxy"}}, nftlib.MonitorRcvBuf, nil); err != nil {
		t.Skipf("no change monitor here: %v", err)
	}
	looks, cleans = &atomic.Int64{}, &atomic.Int64{}
	w := &Watcher{Config: Config{NetNS: testns.Path(ns)}, CheckEvery: every, Changes: k.OtherChanges(),
		OnLook: func() { looks.Add(1) }, OnClean: func(Result, error) { cleans.Add(1) }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ns, closeKernel, looks, cleans
}

// waitFor polls cond every 5 ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}

// TestKernelWatchIdleLooksNever: with the change monitor, a node where
// nothing changes costs the Watcher no look (it used to look every
// CheckEvery, a second by default), and kube-proxy's table that then
// appears is removed at once, without waiting for a period.
func TestKernelWatchIdleLooksNever(t *testing.T) {
	ns, _, looks, cleans := watchedWatcher(t, 10*time.Millisecond)
	// Quiet for 50 periods.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := looks.Load(); n > 0 {
			t.Fatalf("%d looks in a namespace where nothing changed", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	inNS(t, ns, "nft 'add table ip kube-proxy; add chain ip kube-proxy services'")
	if !waitFor(5*time.Second, func() bool { return cleans.Load() > 0 }) {
		t.Fatal("kube-proxy's table not cleaned within 5 s of its creation")
	}
	if out := testns.NFT(t, ns, "list", "tables"); strings.Contains(out, "kube-proxy") {
		t.Errorf("kube-proxy's table still there:\n%s", out)
	}
	// Our removal is another process's commit for the monitor: one more
	// look at most, then quiet again.
	time.Sleep(100 * time.Millisecond)
	quiet := looks.Load()
	time.Sleep(300 * time.Millisecond)
	if n := looks.Load() - quiet; n > 0 {
		t.Errorf("%d more looks after the removal, with nothing changing", n)
	}
}

// TestKernelWatchOthersLongPeriod: with the change monitor and a long
// CheckEvery, kube-proxy's table is removed as soon as it appears (the
// first change is looked at without waiting for CheckEvery), and again
// when it comes back later.
func TestKernelWatchOthersLongPeriod(t *testing.T) {
	ns, _, _, cleans := watchedWatcher(t, 200*time.Millisecond)
	for i := range 2 {
		inNS(t, ns, "nft add table ip kube-proxy")
		if !waitFor(5*time.Second, func() bool { return cleans.Load() > int64(i) }) {
			t.Fatalf("kube-proxy's table (%d) not cleaned within 5 s", i+1)
		}
		time.Sleep(300 * time.Millisecond) // past CheckEvery since the last look
	}
}

// TestKernelWatchMonitorGone: when the change monitor stops, the Watcher
// looks every CheckEvery again.
func TestKernelWatchMonitorGone(t *testing.T) {
	_, closeKernel, looks, _ := watchedWatcher(t, 10*time.Millisecond)
	closeKernel() // and its monitor
	if !waitFor(5*time.Second, func() bool { return looks.Load() >= 5 }) {
		t.Fatalf("%d looks within 5 s of the monitor's end, want polling every 10 ms", looks.Load())
	}
}
