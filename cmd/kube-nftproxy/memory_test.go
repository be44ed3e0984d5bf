package main

import (
	"context"
	"errors"
	"math"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// TestLargeTxMemory checks that largeTxMemory sets a soft memory limit a
// little above what the runtime holds, never above one already set
// (GOMEMLIMIT), and that its done puts the previous limit back.
func TestLargeTxMemory(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	tests := []struct {
		name  string
		prior int64
		lower bool // whether the limit during the transaction is below prior
	}{
		{"no limit before", math.MaxInt64, true},
		{"a lower limit kept", 1 << 20, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(tc.prior)
			done := largeTxMemory()
			during := debug.SetMemoryLimit(-1)
			held := runtimeHeld()
			done()
			if after := debug.SetMemoryLimit(-1); after != tc.prior {
				t.Errorf("limit after done = %d, want the prior %d", after, tc.prior)
			}
			switch {
			case !tc.lower && during != tc.prior:
				t.Errorf("limit during = %d, want the prior %d kept", during, tc.prior)
			case tc.lower && (during >= tc.prior || during < held):
				t.Errorf("limit during = %d, want between the runtime's %d and %d", during, held, tc.prior)
			}
		})
	}
}

// TestIdleGC checks idleGC's pacing: GOGC off and a limit a little above
// what the process holds after a sync that wrote nothing, both put back
// by one that wrote something or by a collection after which the live
// heap had grown, and a GOGC=off or GOMEMLIMIT of the user's left alone.
func TestIdleGC(t *testing.T) {
	origPercent, origLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(origPercent); debug.SetMemoryLimit(origLimit) })
	tests := []struct {
		name     string
		percent  int
		limit    int64
		wantIdle bool
	}{
		{"defaults", 100, math.MaxInt64, true},
		{"the user's GOGC=off", -1, 1 << 40, false},
		{"the user's tight GOMEMLIMIT", 100, 1 << 20, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.percent)
			debug.SetMemoryLimit(tc.limit)
			var g idleGC
			g.synced(false)
			percent, limit := gcSettings()
			if g.idle != tc.wantIdle {
				t.Fatalf("idle = %v after a sync that wrote nothing, want %v", g.idle, tc.wantIdle)
			}
			if tc.wantIdle && (percent != -1 || limit >= tc.limit || limit < runtimeHeld()) {
				t.Errorf("idle: GOGC %d, limit %d; want off and a limit above the %d held", percent, limit, runtimeHeld())
			}
			if !tc.wantIdle && (percent != tc.percent || limit != tc.limit) {
				t.Errorf("GOGC %d, limit %d; want the user's %d, %d", percent, limit, tc.percent, tc.limit)
			}
			g.synced(true)
			if percent, limit := gcSettings(); percent != tc.percent || limit != tc.limit {
				t.Errorf("after a sync that wrote: GOGC %d, limit %d; want %d, %d back", percent, limit, tc.percent, tc.limit)
			}
		})
	}
}

// TestIdleGCLiveHeapGrew checks the way out of idle pacing that keeps a
// growing live heap from a collection after every allocation.
func TestIdleGCLiveHeapGrew(t *testing.T) {
	origPercent, origLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(origPercent); debug.SetMemoryLimit(origLimit) })
	var g idleGC
	g.synced(false)
	if !g.idle {
		t.Fatal("not idle after a sync that wrote nothing")
	}
	g.collected() // the live heap as it was: still idle
	if !g.idle {
		t.Fatal("a collection with the live heap unchanged ended idle pacing")
	}
	g.mu.Lock()
	g.live, g.headroom = 0, 2 // as if the live heap grew from nothing
	g.mu.Unlock()
	g.collected()
	if percent, limit := gcSettings(); g.idle || percent != 100 || limit != math.MaxInt64 {
		t.Errorf("after the live heap grew: idle %v, GOGC %d, limit %d; want GOGC's pacing back", g.idle, percent, limit)
	}
}

// gcRecorder is a Backend that records GOGC during each Sync and fails
// the syncs its fail says.
type gcRecorder struct {
	proxier.Backend
	fail []bool
	seen []int
}

func (r *gcRecorder) Sync(context.Context, *model.State) (proxier.SyncResult, error) {
	percent, _ := gcSettings()
	r.seen = append(r.seen, percent)
	if len(r.seen) <= len(r.fail) && r.fail[len(r.seen)-1] {
		return proxier.SyncResult{}, errors.New("refused")
	}
	return proxier.SyncResult{}, nil
}

// TestLeanFirstSync checks that syncs run under firstSyncGOGC until one
// succeeds, then under the GOGC before, which is back after each sync,
// and that a lower or disabled GOGC of the user's is kept.
func TestLeanFirstSync(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	for _, tc := range []struct {
		user int
		fail []bool
		want []int
	}{
		{100, nil, []int{firstSyncGOGC, 100, 100}},
		{100, []bool{true, true}, []int{firstSyncGOGC, firstSyncGOGC, firstSyncGOGC, 100}},
		{10, nil, []int{10, 10}},
		{-1, nil, []int{-1, -1}},
	} {
		debug.SetGCPercent(tc.user)
		rec := &gcRecorder{fail: tc.fail}
		b := &leanFirstSync{Backend: rec}
		for range tc.want {
			_, _ = b.Sync(context.Background(), nil)
			if percent, _ := gcSettings(); percent != tc.user {
				t.Errorf("GOGC %d: %d after a sync", tc.user, percent)
			}
		}
		if !slices.Equal(rec.seen, tc.want) {
			t.Errorf("GOGC %d, failures %v: syncs ran under GOGC %v, want %v", tc.user, tc.fail, rec.seen, tc.want)
		}
	}
}
