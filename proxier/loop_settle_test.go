package proxier

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// settlingBackend records the order of syncs, the loop's callbacks and
// Settle.
type settlingBackend struct {
	fakeBackend
	mu     sync.Mutex
	events []string
}

func (s *settlingBackend) note(e string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
}

func (s *settlingBackend) Settle() { s.note("settle") }

func (s *settlingBackend) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// A Settler's Settle comes after the sync is reported (OnSync, OnApplied),
// before the next sync.
func TestLoopSettlesAfterReport(t *testing.T) {
	b := &settlingBackend{}
	l := runLoop(t, b, 0, func(SyncResult, time.Duration, error) { b.note("reported") })
	l.OnApplied = func(*model.State) { b.note("applied") }
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "the first settle", func() bool { return len(b.seen()) == 3 })
	l.SetState(model.NewState())
	testutil.WaitFor(t, 5*time.Second, "the second settle", func() bool { return len(b.seen()) == 6 })
	want := []string{"reported", "applied", "settle", "reported", "applied", "settle"}
	if got := b.seen(); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
