package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// TestSetCgroupMemoryLimit checks that the soft memory limit is set a
// margin below the cgroup's limit, and logged, only when the cgroup has
// a limit and the user set no GOMEMLIMIT.
func TestSetCgroupMemoryLimit(t *testing.T) {
	orig := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	limited := fstest.MapFS{
		"proc/self/cgroup":             {Data: []byte("0::/pod\n")},
		"proc/self/mountinfo":          {Data: []byte(mountV2)},
		"sys/fs/cgroup/pod/memory.max": {Data: []byte("419430400\n")},
	}
	tests := []struct {
		name      string
		fsys      fstest.MapFS
		userLimit string
		want      int64
	}{
		{"a cgroup limit", limited, "", 419430400 - 419430400/cgroupMemoryMargin},
		{"the user's GOMEMLIMIT=off", limited, "off", 0},
		{"the user's GOMEMLIMIT", limited, "1GiB", 0},
		{"no memory cgroup", fstest.MapFS{"proc/self/cgroup": {}, "proc/self/mountinfo": {}}, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			var logs bytes.Buffer
			got := setCgroupMemoryLimit(tc.fsys, tc.userLimit, slog.New(slog.NewTextHandler(&logs, nil)))
			limit := debug.SetMemoryLimit(-1)
			switch {
			case got != tc.want:
				t.Errorf("soft limit %d, want %d", got, tc.want)
			case tc.want == 0 && limit != math.MaxInt64:
				t.Errorf("the runtime's limit is %d, want none", limit)
			case tc.want != 0 && limit != tc.want:
				t.Errorf("the runtime's limit is %d, want %d", limit, tc.want)
			case tc.want != 0 && !strings.Contains(logs.String(), "file=/sys/fs/cgroup/pod/memory.max"):
				t.Errorf("the log does not say where the limit was found: %s", logs.String())
			}
		})
	}
}

// TestMemoryPressure follows the live heap after each sync against a
// soft limit of 100 bytes: a warning at nine tenths, once, and a word
// when it is back under three quarters.
func TestMemoryPressure(t *testing.T) {
	tests := []struct {
		name    string
		ceiling int64
		live    []uint64
		want    []string // the messages' levels, in order
	}{
		{"no ceiling", 0, []uint64{50, 95, 200}, nil},
		{"under nine tenths", 100, []uint64{10, 89, 60}, nil},
		{"at nine tenths: warned once", 100, []uint64{50, 90, 99, 120}, []string{"WARN"}},
		{"between the marks: no flapping", 100, []uint64{95, 80, 91, 76}, []string{"WARN"}},
		{"back under three quarters", 100, []uint64{95, 74, 92}, []string{"WARN", "INFO", "WARN"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			p := &memoryPressure{ceiling: tc.ceiling}
			for _, l := range tc.live {
				p.synced(l, log)
			}
			var got []string
			for line := range strings.Lines(logs.String()) {
				for _, level := range []string{"WARN", "INFO"} {
					if strings.Contains(line, "level="+level) {
						got = append(got, level)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("logged %v, want %v:\n%s", got, tc.want, logs.String())
			}
		})
	}
}

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
		{"the cgroup's ceiling paced under", 1 << 40, true},
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
// heap had grown, and a GOGC=off or GOMEMLIMIT of the user's left alone;
// the cgroup's ceiling (setCgroupMemoryLimit) is paced under and kept.
func TestIdleGC(t *testing.T) {
	origPercent, origLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(origPercent); debug.SetMemoryLimit(origLimit) })
	tests := []struct {
		name     string
		percent  int
		limit    int64
		ceiling  int64 // idleGC.ceiling: the limit is ours when equal
		wantIdle bool
		capped   bool // the idle limit is the ceiling, below what the process holds
	}{
		{"defaults", 100, math.MaxInt64, 0, true, false},
		{"the cgroup's ceiling", 100, 1 << 40, 1 << 40, true, false},
		{"the cgroup's ceiling below the idle limit", 100, 1 << 20, 1 << 20, true, true},
		{"the user's GOGC=off", -1, 1 << 40, 0, false, false},
		{"the user's tight GOMEMLIMIT", 100, 1 << 20, 0, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.percent)
			debug.SetMemoryLimit(tc.limit)
			g := &idleGC{ceiling: tc.ceiling}
			g.synced(false)
			percent, limit := gcSettings()
			if g.idle != tc.wantIdle {
				t.Fatalf("idle = %v after a sync that wrote nothing, want %v", g.idle, tc.wantIdle)
			}
			if tc.wantIdle && !tc.capped && (percent != -1 || limit >= tc.limit || limit < runtimeHeld()) {
				t.Errorf("idle: GOGC %d, limit %d; want off and a limit above the %d held, below %d", percent, limit, runtimeHeld(), tc.limit)
			}
			if tc.capped && (percent != -1 || limit != tc.limit) {
				t.Errorf("idle: GOGC %d, limit %d; want off and the ceiling %d", percent, limit, tc.limit)
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
