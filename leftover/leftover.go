// Package leftover removes what upstream kube-proxy leaves behind when a
// node switches to kube-nftproxy, as kube-proxy itself does when it
// switches between its modes (CleanupLeftovers): its nftables mode's
// tables (ip and ip6 kube-proxy), the chains of its iptables and ipvs
// modes in iptables-nft's tables with the rules that jump to them, its
// ipvs mode's kube-ipvs0 with the virtual servers on its addresses, and
// its ipsets; all over netlink. Chains in iptables-legacy's tables cannot
// be changed over netlink: they are reported, with what to run.
//
// Only kube-proxy's objects, by their upstream names, are touched:
// iptables-nft's tables and built-in chains stay, as do other chains and
// rules (Docker's, a CNI's) and kubelet's KUBE-* chains.
//
// A Watcher keeps looking while the proxy runs: kube-proxy rules that
// appear later (an old kube-proxy still running during a DaemonSet switch)
// would take Service traffic from ours.
package leftover

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Config says where to clean and what.
type Config struct {
	// NetNS is the network namespace's path ("" for the current one).
	NetNS string
	// IPVS, when set, removes upstream IPVS mode's kube-ipvs0 and the
	// virtual servers on its addresses. Leave it off in our IPVS mode,
	// which owns the same link and its virtual servers.
	IPVS bool
	// Legacy, when set, looks for kube-proxy's chains in the loaded
	// iptables-legacy tables (to report them).
	Legacy bool
}

// Result is what Clean found and removed.
type Result struct {
	// Removed describes each thing removed, for a log.
	Removed []string
	// Counts are how many of each kind were removed (metric labels:
	// nftables_table, iptables_chain, iptables_jump, ipvs_virtual_server,
	// ipvs_link, ipset).
	Counts map[string]int
	// Legacy are kube-proxy's chains in iptables-legacy tables, which
	// stay: nothing over netlink can remove them.
	Legacy []Legacy
	// BusyIPSets are kube-proxy's ipsets that a rule still uses (an
	// iptables-legacy one), which stay.
	BusyIPSets []string
}

// Empty reports whether nothing was found.
func (r *Result) Empty() bool {
	return len(r.Removed) == 0 && len(r.Legacy) == 0 && len(r.BusyIPSets) == 0
}

func (r *Result) add(kind string, n int) {
	if n == 0 {
		return
	}
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	r.Counts[kind] += n
}

// Clean removes upstream kube-proxy's objects: nftables first (the rules
// that take traffic), then IPVS mode's link and virtual servers, then the
// ipsets (which a rule may have used). It goes on after a failure and
// returns every error.
func Clean(cfg Config) (Result, error) {
	var res Result
	var errs []error
	k, err := nftlib.OpenKernel(cfg.NetNS)
	if err != nil {
		return res, fmt.Errorf("opening nftables: %w", err)
	}
	defer k.Close()
	found, err := cleanNFTables(k)
	if err != nil {
		errs = append(errs, err)
	} else if found != nil {
		res.Removed = append(res.Removed, found.describe()...)
		res.add("nftables_table", len(found.tables))
		for _, p := range found.iptables {
			res.add("iptables_chain", len(p.chains))
			res.add("iptables_jump", len(p.jumps))
		}
	}
	if cfg.IPVS {
		if err := cleanIPVS(cfg.NetNS, &res); err != nil {
			errs = append(errs, err)
		}
	}
	destroyed, busy, err := destroyIPSets(cfg.NetNS, ipsetNames())
	// The rules just deleted drop their references to the sets after the
	// commit, from a kernel work queue: wait a little for them.
	for wait := 10 * time.Millisecond; err == nil && len(busy) > 0 && res.Counts["iptables_jump"]+res.Counts["iptables_chain"] > 0 && wait < 2*time.Second; wait *= 2 {
		time.Sleep(wait)
		var more []string
		more, busy, err = destroyIPSets(cfg.NetNS, busy)
		destroyed = append(destroyed, more...)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if len(destroyed) > 0 {
		res.Removed = append(res.Removed, fmt.Sprintf("ipsets (%s)", abbreviate(destroyed, 4)))
		res.add("ipset", len(destroyed))
	}
	res.BusyIPSets = busy
	if cfg.Legacy {
		legacy, err := scanLegacy(cfg.NetNS)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading iptables-legacy tables: %w", err))
		}
		res.Legacy = legacy
	}
	return res, errors.Join(errs...)
}

// Log writes what a Clean did: what was removed (a warning while running,
// when something appeared after start; info at start), and a warning for
// what stays.
func Log(log *slog.Logger, res Result, whileRunning bool) {
	if len(res.Removed) > 0 {
		if whileRunning {
			log.Warn("upstream kube-proxy's rules appeared while running (is an old kube-proxy still running on this node?); removed them, as they would take Service traffic",
				"removed", res.Removed)
		} else {
			log.Info("removed upstream kube-proxy's leftovers", "removed", res.Removed)
		}
	}
	for _, l := range res.Legacy {
		log.Warn("upstream kube-proxy's iptables-legacy chains are on this node; kube-nftproxy cannot remove them (no netlink interface) and they may take Service traffic",
			"table", l.Family+" "+l.Table, "chains", len(l.Chains), "names", abbreviate(l.Chains, 4), "fix", legacyCommand(res.Legacy))
	}
	if len(res.BusyIPSets) > 0 {
		log.Warn("upstream kube-proxy's ipsets are still used by a rule (an iptables-legacy one?) and stay",
			"ipsets", res.BusyIPSets)
	}
}

// Metrics counts the leftovers removed.
type Metrics struct {
	Removed *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Removed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "kubenftproxy", Name: "upstream_leftovers_removed_total",
		Help: "Objects of upstream kube-proxy removed (at start and while running), by kind",
	}, []string{"kind"})}
	if reg != nil {
		reg.MustRegister(m.Removed)
	}
	return m
}

// Observe counts what res removed.
func (m *Metrics) Observe(res Result) {
	if m == nil {
		return
	}
	for kind, n := range res.Counts {
		m.Removed.WithLabelValues(kind).Add(float64(n))
	}
}
