package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/leftover"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// upstreamCleanup is the start-up removal of upstream kube-proxy's
// leftovers, and what the watcher that follows needs.
type upstreamCleanup struct {
	cfg leftover.Config
	res leftover.Result
}

// cleanUpstream removes, before the first sync, what upstream kube-proxy
// left (its nftables tables, its iptables and ipvs modes' chains in
// iptables-nft's tables, its ipsets; kube-ipvs0 and the virtual servers on
// it unless we run IPVS mode, which owns them), as kube-proxy does when it
// changes mode. A failure is logged: our rules are still worth writing.
func cleanUpstream(ipvsMode bool, log *slog.Logger) *upstreamCleanup {
	u := &upstreamCleanup{cfg: leftover.Config{IPVS: !ipvsMode, Legacy: true}}
	res, err := leftover.Clean(u.cfg)
	leftover.Log(log, res, false)
	if err != nil {
		log.Error("could not remove upstream kube-proxy's leftovers; they may take Service traffic", "err", err)
	}
	u.res = res
	return u
}

// watch counts the start-up removal and keeps removing upstream
// kube-proxy's objects that appear until ctx ends.
func (u *upstreamCleanup) watch(ctx context.Context, log *slog.Logger, m *proxier.Metrics) {
	metrics := leftover.NewMetrics(m.Registry)
	metrics.Observe(u.res)
	w := &leftover.Watcher{Config: u.cfg, Log: log, Metrics: metrics}
	go w.Run(ctx)
}

// cleanupUpstream is --cleanup's part for upstream kube-proxy's objects:
// all of them, as `kube-proxy --cleanup` removes every mode's (IPVS mode's
// kube-ipvs0 and virtual servers are cleanupIPVS's). It reports whether it
// removed anything.
func cleanupUpstream(out io.Writer, log *slog.Logger) (bool, error) {
	res, err := leftover.Clean(leftover.Config{Legacy: true})
	if len(res.Removed) > 0 {
		fmt.Fprintln(out, "removed upstream kube-proxy's leftovers: "+strings.Join(res.Removed, "; "))
	}
	res.Removed = nil // printed above
	leftover.Log(log, res, false)
	// The caller names what failed.
	return len(res.Counts) > 0, err
}
