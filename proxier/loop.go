package proxier

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Loop owns the current State and calls the backend: at most one sync per
// MinSyncPeriod after a change, a full resync every SyncPeriod, and a retry
// after a failed sync. Sources call SetState; the loop never blocks them.
type Loop struct {
	backend Backend
	log     *slog.Logger

	// MinSyncPeriod is the least time between two syncs (kube-proxy's
	// --iptables-min-sync-period, default 1s); SyncPeriod is the most
	// (--iptables-sync-period, default 30s).
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// OnSync, when set, is called after every sync attempt (metrics, healthz, tests).
	OnSync func(SyncResult, time.Duration, error)
	// OnQueued, when set, is called when a change asks for a sync.
	OnQueued func()
	// OnApplied, when set, is called with each State a sync applied.
	OnApplied func(*State)

	mu      sync.Mutex
	state   *State
	source  func() *State
	changed chan struct{}
}

// NewLoop returns a loop with kube-proxy's default periods.
func NewLoop(b Backend, log *slog.Logger) *Loop {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Loop{backend: b, log: log, MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second,
		changed: make(chan struct{}, 1)}
}

// SetState hands the loop a new snapshot and asks for a sync.
func (l *Loop) SetState(st *State) {
	l.mu.Lock()
	l.state = st
	l.mu.Unlock()
	l.Changed()
}

// SetSource makes the loop take a snapshot from source when it syncs,
// instead of one handed over with SetState: sources with frequent events
// (the API server) then build a snapshot per sync, not per event.
func (l *Loop) SetSource(source func() *State) {
	l.mu.Lock()
	l.source = source
	l.mu.Unlock()
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

func (l *Loop) current() *State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.source != nil {
		return l.source()
	}
	return l.state
}

// Run syncs until ctx is done. The first sync happens as soon as a State is set.
func (l *Loop) Run(ctx context.Context) error {
	var last time.Time
	periodic := time.NewTimer(l.SyncPeriod)
	defer periodic.Stop()
	retry := false
	for {
		var wait <-chan time.Time
		if retry {
			wait = time.After(l.MinSyncPeriod)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.changed:
		case <-periodic.C:
		case <-wait:
		}
		// Debounce: changes that arrive within MinSyncPeriod of the last
		// sync are folded into the next one.
		if d := l.MinSyncPeriod - time.Since(last); !last.IsZero() && d > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
		st := l.current()
		if st == nil {
			continue
		}
		start := time.Now()
		res, err := l.backend.Sync(ctx, st)
		took := time.Since(start)
		last = time.Now()
		periodic.Reset(l.SyncPeriod)
		retry = err != nil
		if err != nil {
			l.log.Error("sync failed; the kernel keeps the previous rules, retrying with a full sync", "err", err, "took", took)
		} else if res.Changed {
			l.log.Info("synced", "full", res.Full, "services", len(st.Services), "messages", res.Messages, "bytes", res.Bytes, "took", took)
		}
		if l.OnSync != nil {
			l.OnSync(res, took, err)
		}
		if err == nil && l.OnApplied != nil {
			l.OnApplied(st)
		}
	}
}
