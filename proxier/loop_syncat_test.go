package proxier

import (
	"context"
	"sync"
	"testing"
	"time"
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

func (a *askingBackend) Sync(ctx context.Context, st *State) (SyncResult, error) {
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
	l.SetState(NewState())
	waitFor(t, "the asked-for syncs", func() bool { return b.count() == 3 })
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
	l.SetState(NewState())
	waitFor(t, "the first sync", func() bool { return b.count() == 1 })
	l.SyncAt(time.Now().Add(50 * time.Millisecond))
	waitFor(t, "the asked-for sync", func() bool { return b.count() == 2 })
}
