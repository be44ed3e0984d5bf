package proxier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// fakeBackend records syncs and fails the ones it is told to.
type fakeBackend struct {
	mu     sync.Mutex
	synced []*model.State
	fail   int // fail this many syncs first
}

func (f *fakeBackend) Sync(_ context.Context, st *model.State) (SyncResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced = append(f.synced, st)
	if f.fail > 0 {
		f.fail--
		return SyncResult{}, errors.New("refused")
	}
	return SyncResult{Changed: true}, nil
}

func (f *fakeBackend) Cleanup(context.Context) (bool, error) { return false, nil }

func (f *fakeBackend) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.synced)
}

func runLoop(t *testing.T, b Backend, minSync time.Duration, onSync func(SyncResult, time.Duration, error)) *Loop {
	t.Helper()
	l := NewLoop(b, nil)
	l.MinSyncPeriod, l.SyncPeriod, l.OnSync = minSync, time.Hour, onSync
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// Changes that arrive while the loop waits out MinSyncPeriod are folded
// into one sync of the latest state.
func TestLoopBatchesChanges(t *testing.T) {
	b := &fakeBackend{}
	l := runLoop(t, b, 200*time.Millisecond, nil)
	first := model.NewState()
	l.SetState(first)
	testutil.WaitFor(t, 5*time.Second, "the first sync", func() bool { return b.count() == 1 })
	var last *model.State
	for i := 0; i < 10; i++ {
		last = model.NewState()
		l.SetState(last)
	}
	testutil.WaitFor(t, 5*time.Second, "the batched sync", func() bool { return b.count() >= 2 })
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.synced) != 2 || b.synced[1] != last {
		t.Errorf("got %d syncs (last is latest state: %v), want 2 with the latest state", len(b.synced), b.synced[len(b.synced)-1] == last)
	}
}

// A failed sync is retried without a new change.
func TestLoopRetriesFailedSync(t *testing.T) {
	b := &fakeBackend{fail: 2}
	var mu sync.Mutex
	var errs int
	l := runLoop(t, b, 10*time.Millisecond, func(_ SyncResult, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs++
		}
	})
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "a successful retry", func() bool { return b.count() == 3 })
	mu.Lock()
	defer mu.Unlock()
	if errs != 2 {
		t.Errorf("OnSync saw %d errors, want 2", errs)
	}
}

// A source set with SetSource is not synced, not even by the periodic
// timer, before it says it is ready: a restart while the API server is
// away must leave the rules in the kernel alone.
func TestLoopWaitsForCompleteView(t *testing.T) {
	b := &fakeBackend{}
	l := NewLoop(b, nil)
	l.MinSyncPeriod, l.SyncPeriod = time.Millisecond, 5*time.Millisecond
	calls := 0
	var mu sync.Mutex
	l.SetSource(func() *model.State {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return model.NewState()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Changes and many periodic ticks pass without a sync.
	for i := 0; i < 20; i++ {
		l.Changed()
		time.Sleep(time.Millisecond) // let ticks pass; the check below is the assertion
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		if b.count() != 0 {
			t.Fatalf("synced %d times before the source was ready", b.count())
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	if calls != 0 {
		t.Errorf("the source was asked for a State %d times before it was ready", calls)
	}
	mu.Unlock()
	l.SourceReady()
	testutil.WaitFor(t, 5*time.Second, "the first sync once ready", func() bool { return b.count() >= 1 })
}

// Failures in a row are retried ever less often, up to the sync period.
func TestNextBackoff(t *testing.T) {
	lo, hi := time.Second, 30*time.Second
	var got []time.Duration
	d := time.Duration(0)
	for i := 0; i < 7; i++ {
		d = nextBackoff(d, lo, hi)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("backoff steps %v, want %v seconds", got, want)
		}
	}
}

// waitingError is a refusal that lasts as long as another process.
type waitingError struct{}

func (waitingError) Error() string              { return "owned by another process" }
func (waitingError) WaitsForOtherProcess() bool { return true }

// A sync refused for as long as another process holds something of ours
// is retried every MinSyncPeriod, not backed off: its end is not
// announced, and nothing else would sync before the sync period.
func TestLoopPollsWhileWaitingForOther(t *testing.T) {
	l := NewLoop(&fakeBackend{}, nil)
	l.MinSyncPeriod, l.SyncPeriod = time.Second, 30*time.Second
	cases := []struct {
		name string
		err  error
		want []time.Duration
	}{
		{"refused", errors.New("refused"), []time.Duration{1, 2, 4, 8, 16, 30}},
		{"owned", fmt.Errorf("applying: %w", waitingError{}), []time.Duration{1, 1, 1, 1, 1, 1}},
	}
	for _, tc := range cases {
		var got []time.Duration
		d := time.Duration(0)
		for range tc.want {
			d = l.retryAfter(d, tc.err)
			got = append(got, d/time.Second)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: retries after %v s, want %v s", tc.name, got, tc.want)
		}
	}
}

// A repair waits repairPaceMin after the last sync, not MinSyncPeriod; one
// that follows a repair sooner than MinSyncPeriod waits twice as long as
// the one before, up to MinSyncPeriod; a quiet MinSyncPeriod starts again.
func TestNextRepairPace(t *testing.T) {
	const hi = time.Second
	steps := []struct {
		since, want time.Duration
	}{
		{time.Hour, 50 * time.Millisecond},
		{10 * time.Millisecond, 100 * time.Millisecond},
		{10 * time.Millisecond, 200 * time.Millisecond},
		{10 * time.Millisecond, 400 * time.Millisecond},
		{10 * time.Millisecond, 800 * time.Millisecond},
		{10 * time.Millisecond, time.Second},
		{10 * time.Millisecond, time.Second},
		{2 * time.Second, 50 * time.Millisecond},
	}
	pace := time.Duration(0)
	for i, s := range steps {
		if pace = nextRepairPace(pace, s.since, hi); pace != s.want {
			t.Fatalf("step %d (%v after the last sync): pace %v, want %v", i, s.since, pace, s.want)
		}
	}
	if got := nextRepairPace(0, time.Hour, 10*time.Millisecond); got != 10*time.Millisecond {
		t.Errorf("pace with MinSyncPeriod 10ms: %v, want 10ms", got)
	}
}

// Only a repair shortens the pause after a sync: a change waits out what
// is left of MinSyncPeriod.
func TestLoopPauseRepair(t *testing.T) {
	l := NewLoop(&fakeBackend{}, nil)
	l.MinSyncPeriod = time.Second
	last := time.Now()
	var pace time.Duration
	if d := l.pause(last, &pace); d <= 900*time.Millisecond || d > time.Second {
		t.Errorf("a change right after a sync waits %v, want about MinSyncPeriod (1s)", d)
	}
	l.Repair()
	if d := l.pause(last, &pace); d <= 0 || d > repairPaceMin {
		t.Errorf("a repair right after a sync waits %v, want at most %v", d, repairPaceMin)
	}
	l.Repair()
	if d := l.pause(last, &pace); d <= repairPaceMin || d > 2*repairPaceMin {
		t.Errorf("a second repair right after waits %v, want up to %v", d, 2*repairPaceMin)
	}
	if d := l.pause(time.Time{}, &pace); d != 0 {
		t.Errorf("the first sync waits %v, want 0", d)
	}
}
