package leftover

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Watcher removes upstream kube-proxy's objects that appear while the
// proxy runs, with a cheap look every CheckEvery: the tables listed and
// kube-proxy's fixed chains looked up by name in iptables-nft's tables
// (the per-Service chains never come without them), kube-ipvs0 when that
// is to go, and the loaded iptables-legacy tables (only reported, once
// per change). A look costs a few small netlink requests, whatever the
// size of our own ruleset.
//
// It does not listen to nftables notifications: while anyone listens, the
// kernel builds a notification for every object of our own transactions
// too, which the change monitor avoids for large ones by leaving the
// group (2.5 s of kernel time for a full sync of 10k Services).
type Watcher struct {
	Config  Config
	Log     *slog.Logger
	Metrics *Metrics
	// CheckEvery is the period of the look (0: DefaultCheckEvery).
	CheckEvery time.Duration
	// OnClean, when set, is called after each cleanup while running (for
	// tests).
	OnClean func(Result, error)
}

// DefaultCheckEvery is the Watcher's default period: kube-proxy's rules
// take Service traffic for at most about this long.
const DefaultCheckEvery = time.Second

// LegacyCheckEvery is how often the Watcher reads the iptables-legacy
// tables.
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
	tick := time.NewTicker(every)
	defer tick.Stop()
	// Legacy chains seen at start were reported by the start-up cleanup.
	lastLegacy := ""
	if legacy, err := scanLegacy(w.Config.NetNS); err == nil {
		lastLegacy = fmt.Sprint(legacy)
	}
	lastErr := ""
	legacyEvery := max(1, int(LegacyCheckEvery/every))
	ticks := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Legacy tables can be large (a copy of every rule per read): they
		// are read less often.
		ticks++
		legacyNow := ticks%legacyEvery == 0
		changed := false
		if legacyNow {
			legacy, err := scanLegacy(w.Config.NetNS)
			changed = err == nil && fmt.Sprint(legacy) != lastLegacy
		}
		if !changed && !w.present() {
			continue
		}
		cfg := w.Config
		cfg.Legacy = legacyNow
		res, err := Clean(cfg)
		w.Metrics.Observe(res)
		// Legacy chains are reported once, until they change.
		if key := fmt.Sprint(res.Legacy); !legacyNow || key == lastLegacy {
			res.Legacy = nil
		} else {
			lastLegacy = key
		}
		Log(w.Log, res, true)
		if err != nil && err.Error() != lastErr {
			w.Log.Error("could not remove upstream kube-proxy's rules; retrying at the next look", "err", err)
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		if w.OnClean != nil {
			w.OnClean(res, err)
		}
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
		if _, exists, err := ipvs.DummyAddrs(w.Config.NetNS); exists || err != nil {
			return true
		}
	}
	return false
}
