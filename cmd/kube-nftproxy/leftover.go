package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/kube-nftproxy/kube-nftproxy/leftover"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
)

// upstreamCleanup removes upstream kube-proxy's leftovers once our first
// sync has put our rules in place, then keeps removing those that appear.
type upstreamCleanup struct {
	cfg     leftover.Config
	log     *slog.Logger
	metrics *leftover.Metrics
	once    sync.Once
	// changes, when set, returns the change monitor's signal of other
	// processes' nftables changes: the watcher looks on those rather than
	// every second.
	changes func() <-chan struct{}
}

// newUpstreamCleanup prepares the removal of what upstream kube-proxy left
// (its nftables tables, its iptables and ipvs modes' chains in
// iptables-nft's tables, its ipsets; kube-ipvs0 and the virtual servers on
// it unless we run IPVS mode, which owns them), as kube-proxy does when it
// changes mode. Its metrics are registered now, so they are exported from
// the start.
func newUpstreamCleanup(ipvsMode bool, log *slog.Logger, m *serve.Metrics) *upstreamCleanup {
	return &upstreamCleanup{cfg: leftover.Config{IPVS: !ipvsMode, Legacy: true}, log: log,
		metrics: leftover.NewMetrics(m.Registry.Registerer())}
}

// afterSync removes the leftovers after our first successful sync (later
// calls do nothing) and starts the watcher. Not before: kube-proxy's rules
// send Services' traffic to the same endpoints as ours, while a node
// between their removal and our first sync, which waits for the first
// complete view, has no Service rules at all. A failure is logged: our
// rules work anyway, unless kube-proxy's take the traffic first.
func (u *upstreamCleanup) afterSync(ctx context.Context) {
	u.once.Do(func() {
		res, err := leftover.Clean(u.cfg)
		leftover.Log(u.log, res, false)
		if err != nil {
			u.log.Error("could not remove upstream kube-proxy's leftovers; they may take Service traffic", "err", err)
		}
		u.metrics.Observe(res)
		w := &leftover.Watcher{Config: u.cfg, Log: u.log, Metrics: u.metrics}
		if u.changes != nil {
			w.Changes = u.changes()
		}
		go w.Run(ctx)
	})
}
