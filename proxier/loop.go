package proxier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/errlog"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Loop owns the current State and calls the backend: at most one sync per
// MinSyncPeriod after a change, a periodic sync every SyncPeriod (which
// writes nothing when nothing changed: see the backends), and a retry
// after a failed sync. Sources call SetState; the loop never blocks them.
//
// Nothing is synced before the source has a complete view: SetState hands
// over one, and a source set with SetSource must call SourceReady first.
// Until then the periodic timer does nothing, so a restart while the API
// server is away leaves the rules in the kernel as they are.
type Loop struct {
	backend Backend
	log     *slog.Logger

	// MinSyncPeriod is the least time between two syncs (kube-proxy's
	// --iptables-min-sync-period, default 1s); SyncPeriod is the most
	// (--iptables-sync-period, default 30s). A failed sync is retried
	// after MinSyncPeriod, then after twice as long each time it fails
	// again, up to SyncPeriod.
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// OnSync, when set, is called after every sync attempt (metrics, healthz, tests).
	OnSync func(SyncResult, time.Duration, error)
	// OnQueued, when set, is called when a change asks for a sync.
	OnQueued func()
	// OnApplied, when set, is called with each State a sync applied.
	OnApplied func(*model.State)

	mu      sync.Mutex
	state   *model.State
	source  func() *model.State
	ready   bool // the source has a complete view
	changed chan struct{}
	at      time.Time     // a sync asked for at this time (SyncAt); zero: none
	rearm   chan struct{} // SyncAt from another goroutine
	repair  bool          // Repair asked for the next sync
}

// repairPaceMin is the least a repair waits after the last sync: enough
// for a burst of another process's commits to land in one repair.
const repairPaceMin = 50 * time.Millisecond

// NewLoop returns a loop with kube-proxy's default periods.
func NewLoop(b Backend, log *slog.Logger) *Loop {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Loop{backend: b, log: log, MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second,
		changed: make(chan struct{}, 1), rearm: make(chan struct{}, 1)}
}

// SyncAt asks for a sync at t, for timed work of the backend (IPVS
// graceful termination checks connection counts of draining real servers).
// The earliest request wins; every sync drops the pending one, so a
// backend asks again from each Sync for as long as it has such work. A
// sync at t still waits MinSyncPeriod after the last one.
func (l *Loop) SyncAt(t time.Time) {
	l.mu.Lock()
	if l.at.IsZero() || t.Before(l.at) {
		l.at = t
	}
	l.mu.Unlock()
	select {
	case l.rearm <- struct{}{}:
	default:
	}
}

// syncAtTimer is a channel that fires at the pending SyncAt time; nil
// when there is none.
func (l *Loop) syncAtTimer() (<-chan time.Time, *time.Timer) {
	l.mu.Lock()
	at := l.at
	l.mu.Unlock()
	if at.IsZero() {
		return nil, nil
	}
	t := time.NewTimer(time.Until(at))
	return t.C, t
}

// SetState hands the loop a new complete snapshot and asks for a sync.
func (l *Loop) SetState(st *model.State) {
	l.mu.Lock()
	l.state = st
	l.ready = st != nil
	l.mu.Unlock()
	l.Changed()
}

// SetSource makes the loop take a snapshot from source when it syncs,
// instead of one handed over with SetState: sources with frequent events
// (the API server) then build a snapshot per sync, not per event. The loop
// does not call source before SourceReady.
func (l *Loop) SetSource(source func() *model.State) {
	l.mu.Lock()
	l.source = source
	l.mu.Unlock()
}

// SourceReady tells the loop that the source set with SetSource holds a
// complete view (e.g. the API server's first listing has been handled),
// and asks for a sync.
func (l *Loop) SourceReady() {
	l.mu.Lock()
	l.ready = true
	l.mu.Unlock()
	l.Changed()
}

// Changed asks for a sync.
func (l *Loop) Changed() {
	if l.OnQueued != nil {
		l.OnQueued()
	}
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Repair asks for a sync that rewrites what another process changed in
// our rules. Traffic meets the changed rules until then, so it does not
// wait out MinSyncPeriod, which paces the source's changes: the first
// repair after a quiet MinSyncPeriod waits repairPaceMin after the last
// sync, and each one that follows sooner waits twice as long as the one
// before, up to MinSyncPeriod, so that a process changing our rules in a
// loop costs at most one sync per MinSyncPeriod.
func (l *Loop) Repair() {
	l.mu.Lock()
	l.repair = true
	l.mu.Unlock()
	l.Changed()
}

// pause is how long the next sync waits, the last having ended at last:
// what is left of MinSyncPeriod, or of the repair pace (updated in pace)
// when a repair was asked for.
func (l *Loop) pause(last time.Time, pace *time.Duration) time.Duration {
	if last.IsZero() {
		return 0
	}
	since := time.Since(last)
	l.mu.Lock()
	repair := l.repair
	l.repair = false
	l.mu.Unlock()
	wait := l.MinSyncPeriod
	if repair {
		*pace = nextRepairPace(*pace, since, l.MinSyncPeriod)
		wait = min(wait, *pace)
	}
	return wait - since
}

// nextRepairPace is the wait of a repair asked for since after the last
// sync, the one before having waited cur: repairPaceMin after a quiet
// period, doubling while repairs follow each other, up to hi.
func nextRepairPace(cur, since, hi time.Duration) time.Duration {
	if cur == 0 || since >= hi {
		return min(repairPaceMin, hi)
	}
	return min(2*cur, hi)
}

// current is the State to sync now, nil while there is no complete view.
func (l *Loop) current() *model.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ready {
		return nil
	}
	if l.source != nil {
		return l.source()
	}
	return l.state
}

// Run syncs until ctx is done. The first sync happens as soon as there is
// a complete view.
func (l *Loop) Run(ctx context.Context) error {
	// A zero or negative SyncPeriod would fire the periodic timer at once,
	// every time: a sync loop without pause.
	if l.SyncPeriod <= 0 || l.MinSyncPeriod < 0 {
		return fmt.Errorf("sync loop: SyncPeriod %s must be greater than 0 and MinSyncPeriod %s greater than or equal to 0", l.SyncPeriod, l.MinSyncPeriod)
	}
	var last time.Time
	periodic := time.NewTimer(l.SyncPeriod)
	defer periodic.Stop()
	var backoff time.Duration // after a failure: the wait before the retry
	var pace time.Duration    // the last repair's wait (see Repair)
	failures := errlog.New(l.log, l.SyncPeriod)
	for {
		var wait <-chan time.Time
		if backoff > 0 {
			wait = time.After(backoff)
		}
		atC, atTimer := l.syncAtTimer()
		rearmed := false
		select {
		case <-ctx.Done():
			return nil
		case <-l.changed:
		case <-periodic.C:
		case <-wait:
		case <-atC:
		case <-l.rearm:
			rearmed = true
		}
		if atTimer != nil {
			atTimer.Stop()
		}
		if rearmed {
			continue // wait again, with the new SyncAt time
		}
		// Debounce: changes that arrive within MinSyncPeriod of the last
		// sync are coalesced into the next one.
		if d := l.pause(last, &pace); d > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
		st := l.current()
		if st == nil {
			periodic.Reset(l.SyncPeriod)
			continue
		}
		l.mu.Lock()
		l.at = time.Time{} // the backend asks again from Sync if it still needs to
		l.mu.Unlock()
		start := time.Now()
		res, err := l.backend.Sync(ctx, st)
		took := time.Since(start)
		last = time.Now()
		periodic.Reset(l.SyncPeriod)
		if err != nil && ctx.Err() != nil {
			return nil // cut short by the stop, not a failure
		}
		if err != nil {
			backoff = l.retryAfter(backoff, err)
			failures.Failed(err, "sync failed; the kernel keeps the previous rules, retrying with a full sync", "retry_in", backoff, "took", took)
		} else {
			backoff = 0
			failures.Recovered("sync succeeded again")
			l.succeeded(res, st, took)
		}
		if l.OnSync != nil {
			l.OnSync(res, took, err)
		}
		if err == nil && l.OnApplied != nil {
			l.OnApplied(st)
		}
		if s, ok := l.backend.(Settler); ok {
			s.Settle()
		}
	}
}

// succeeded logs a sync that wrote something and asks for the follow-up
// sync the backend wants.
func (l *Loop) succeeded(res SyncResult, st *model.State, took time.Duration) {
	switch {
	case res.CleanupOnly:
		l.log.Info("deleted stale chains", "chains", res.StaleChainsDeleted, "took", took)
	case res.Changed:
		l.log.Info("synced", "full", res.Full, "services", st.Services.Len(), "messages", res.Messages, "bytes", res.Bytes, "took", took, "kernel", res.Kernel)
	}
	if !res.FollowUpAt.IsZero() {
		l.SyncAt(res.FollowUpAt)
	}
}

// Settler is a Backend with work left after a sync that need not delay
// its report: the loop calls Settle after each sync's callbacks, before it
// waits for the next one.
type Settler interface {
	Settle()
}

// WaitsForOther is implemented by sync errors that last as long as another
// process holds something of ours (a table it owns): their end comes with
// no notification (the kernel deletes an owned table when its owner exits
// without a new ruleset generation or an event), so the sync is retried
// every MinSyncPeriod while they last, not backed off to the sync period.
type WaitsForOther interface {
	WaitsForOtherProcess() bool
}

// retryAfter is the wait before retrying a sync that failed with err, the
// last wait having been cur.
func (l *Loop) retryAfter(cur time.Duration, err error) time.Duration {
	var w WaitsForOther
	if errors.As(err, &w) && w.WaitsForOtherProcess() {
		return max(l.MinSyncPeriod, time.Millisecond)
	}
	return nextBackoff(cur, l.MinSyncPeriod, l.SyncPeriod)
}

// nextBackoff doubles the wait after each failure in a row, from lo to hi.
func nextBackoff(cur, lo, hi time.Duration) time.Duration {
	lo = max(lo, time.Millisecond)
	if cur == 0 {
		return lo
	}
	return min(2*cur, max(hi, lo))
}
