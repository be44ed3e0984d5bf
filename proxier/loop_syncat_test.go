package proxier

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// askingBackend asks the loop for a sync 100ms after each of its first
// syncs, as the IPVS backend does while real servers drain.
type askingBackend struct {
	fakeBackend
	loop  *Loop
	asks  int
	times []time.Time
	mu2   sync.Mutex
}

func (a *askingBackend) Sync(ctx context.Context, st *model.State) (SyncResult, error) {
	a.mu2.Lock()
	a.times = append(a.times, time.Now())
	ask := a.asks > 0
	a.asks--
	a.mu2.Unlock()
	if ask {
		a.loop.SyncAt(time.Now().Add(100 * time.Millisecond))
	}
	return a.fakeBackend.Sync(ctx, st)
}

// SyncAt brings a sync without a change at the asked time; a backend that
// stops asking gets no more of them.
func TestLoopSyncAt(t *testing.T) {
	b := &askingBackend{asks: 2}
	l := NewLoop(b, nil)
	b.loop = l
	l.MinSyncPeriod, l.SyncPeriod = 10*time.Millisecond, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "the asked-for syncs", func() bool { return b.count() == 3 })
	time.Sleep(300 * time.Millisecond)
	if n := b.count(); n != 3 {
		t.Errorf("%d syncs, want 3 (one for the state, two asked for)", n)
	}
	b.mu2.Lock()
	defer b.mu2.Unlock()
	for i := 1; i < len(b.times); i++ {
		if d := b.times[i].Sub(b.times[i-1]); d < 90*time.Millisecond {
			t.Errorf("sync %d came %v after the previous one, want about 100ms", i, d)
		}
	}
}

// A SyncAt from another goroutine re-arms a waiting loop.
func TestLoopSyncAtFromOutside(t *testing.T) {
	b := &fakeBackend{}
	l := runLoop(t, b, 0, nil)
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "the first sync", func() bool { return b.count() == 1 })
	l.SyncAt(time.Now().Add(50 * time.Millisecond))
	testutil.WaitFor(t, 5*time.Second, "the asked-for sync", func() bool { return b.count() == 2 })
}

// followUpBackend leaves work for later after its first sync
// (SyncResult.FollowUpAt), and does only that work in the follow-up
// (CleanupOnly), as the nftables backend does with emptied chains.
type followUpBackend struct {
	fakeBackend
	mu2   sync.Mutex
	times []time.Time
}

func (f *followUpBackend) Sync(ctx context.Context, st *model.State) (SyncResult, error) {
	f.mu2.Lock()
	f.times = append(f.times, time.Now())
	n := len(f.times)
	f.mu2.Unlock()
	res, err := f.fakeBackend.Sync(ctx, st)
	switch n {
	case 1:
		res.FollowUpAt = time.Now().Add(100 * time.Millisecond)
	case 2:
		res.CleanupOnly, res.StaleChainsDeleted = true, 4
	}
	return res, err
}

// A backend's FollowUpAt brings one more sync at that time, without a
// change; a follow-up that only cleaned up is logged as such, not as
// "synced".
func TestLoopFollowUp(t *testing.T) {
	b := &followUpBackend{}
	var log syncBuffer
	l := NewLoop(b, slog.New(slog.NewTextHandler(&log, nil)))
	l.MinSyncPeriod, l.SyncPeriod = 10*time.Millisecond, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "the follow-up sync", func() bool { return b.count() == 2 })
	time.Sleep(200 * time.Millisecond) // a third sync would come now if one were asked for
	if n := b.count(); n != 2 {
		t.Errorf("%d syncs, want 2 (the state's and its follow-up)", n)
	}
	b.mu2.Lock()
	if d := b.times[1].Sub(b.times[0]); d < 90*time.Millisecond {
		t.Errorf("the follow-up came %v after the sync, want about 100ms", d)
	}
	b.mu2.Unlock()
	out := log.String()
	if strings.Count(out, "msg=synced") != 1 || !strings.Contains(out, `msg="deleted stale chains" chains=4`) {
		t.Errorf("log: want one synced line and one for the cleanup:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for the loop's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
