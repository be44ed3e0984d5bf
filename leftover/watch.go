package leftover

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Watcher removes upstream kube-proxy's objects that appear while the
// proxy runs. A look is cheap: the tables listed and kube-proxy's fixed
// chains looked up by name in iptables-nft's tables (the per-Service
// chains never come without them), kube-ipvs0 when that is to go, and the
// loaded iptables-legacy tables (only reported, once per change); a few
// small netlink requests, whatever the size of our own ruleset.
//
// With Changes set (the change monitor that the nftables backend already
// runs, Kernel.OtherChanges), a look runs when another process changes an
// nftables table, at most once per CheckEvery, and otherwise only every
// LegacyCheckEvery (iptables-legacy and kube-ipvs0 send no nftables
// notification): an idle node costs no look at all. Without it (no
// monitor, or it stopped), a look runs every CheckEvery. The Watcher
// does not join the notification group itself: while anyone listens, the
// kernel builds a notification for every object of our own transactions
// too, which the change monitor avoids for large ones by leaving the group
// (see nftlib.Watcher.SetMember), and tells afterwards if another process
// committed meanwhile.
type Watcher struct {
	Config  Config
	Log     *slog.Logger
	Metrics *Metrics
	// CheckEvery is the period of the look without Changes, and the least
	// time between two looks with it (0: DefaultCheckEvery).
	CheckEvery time.Duration
	// Changes, when set, is signalled when another process changes
	// nftables, and closed when it no longer follows changes.
	Changes <-chan struct{}
	// OnClean, when set, is called after each cleanup while running, and
	// OnLook after each look: how often the Watcher looks and cleans,
	// which neither logs nor metrics say when nothing is found.
	OnClean func(Result, error)
	OnLook  func()

	lastLegacy, lastErr string
}

// DefaultCheckEvery is the Watcher's default period: kube-proxy's rules
// take Service traffic for at most about this long.
const DefaultCheckEvery = time.Second

// LegacyCheckEvery is how often the Watcher reads the iptables-legacy
// tables (and, with Changes, looks at all).
const LegacyCheckEvery = 30 * time.Second

// Run looks until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	if w.Log == nil {
		w.Log = slog.New(slog.DiscardHandler)
	}
	every := w.CheckEvery
	if every <= 0 {
		every = DefaultCheckEvery
	}
	// Legacy chains seen at start were reported by the start-up cleanup.
	if legacy, err := scanLegacy(w.Config.NetNS); err == nil {
		w.lastLegacy = fmt.Sprint(legacy)
	}
	changes := w.Changes
	period := every
	if changes != nil {
		period = LegacyCheckEvery
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	legacyEvery := max(1, int(LegacyCheckEvery/period))
	ticks := 0
	var last time.Time         // the first change is looked at at once
	var retry <-chan time.Time // with changes: after a failed cleanup
	for {
		legacyNow := false
		select {
		case <-ctx.Done():
			return
		case <-retry:
		case _, ok := <-changes:
			if !ok { // no more events: look every CheckEvery
				changes, legacyEvery, ticks = nil, max(1, int(LegacyCheckEvery/every)), 0
				tick.Reset(every)
				continue
			}
			// At most one look per CheckEvery: changes meanwhile
			// leave the channel signalled for the next.
			if !pause(ctx, every-time.Since(last)) {
				return
			}
		case <-tick.C:
			// Legacy tables can be large (a copy of every rule per
			// read): they are read less often.
			ticks++
			legacyNow = ticks%legacyEvery == 0
		}
		last = time.Now()
		w.look(legacyNow)
		retry = nil
		if changes != nil && w.lastErr != "" {
			retry = time.After(every)
		}
		if w.OnLook != nil {
			w.OnLook()
		}
	}
}

// pause waits d (nothing if d <= 0); false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// look removes what it finds of kube-proxy's; with legacyNow it also
// reads the iptables-legacy tables.
func (w *Watcher) look(legacyNow bool) {
	changed := false
	if legacyNow {
		legacy, err := scanLegacy(w.Config.NetNS)
		changed = err == nil && fmt.Sprint(legacy) != w.lastLegacy
	}
	if !changed && !w.present() {
		return
	}
	cfg := w.Config
	cfg.Legacy = legacyNow
	res, err := Clean(cfg)
	w.Metrics.Observe(res)
	// Legacy chains are reported once, until they change.
	if key := fmt.Sprint(res.Legacy); !legacyNow || key == w.lastLegacy {
		res.Legacy = nil
	} else {
		w.lastLegacy = key
	}
	Log(w.Log, res, true)
	if err != nil && err.Error() != w.lastErr {
		w.Log.Error("could not remove upstream kube-proxy's rules; retrying at the next look", "err", err)
	}
	w.lastErr = ""
	if err != nil {
		w.lastErr = err.Error()
	}
	if w.OnClean != nil {
		w.OnClean(res, err)
	}
}

// present reports whether anything of kube-proxy's is in nftables, or
// kube-ipvs0 is there when that is to go.
func (w *Watcher) present() bool {
	k, err := nftlib.OpenKernel(w.Config.NetNS)
	if err != nil {
		return false
	}
	defer k.Close()
	if ok, err := anyNFTables(k); ok || err != nil {
		return true // an error: let Clean say what it is
	}
	if w.Config.IPVS {
		if _, exists, err := ipvsnl.DummyAddrs(w.Config.NetNS); exists || err != nil {
			return true
		}
	}
	return false
}
