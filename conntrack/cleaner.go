package conntrack

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/component-base/metrics"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Metrics are kube-proxy's conntrack reconciler metrics, per IP family
// (ip_family "IPv4" or "IPv6"), with its stability level.
type Metrics struct {
	Deleted  *metrics.CounterVec
	Duration *metrics.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg metrics.KubeRegistry) *Metrics {
	m := &Metrics{
		Deleted: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem: "kubeproxy", Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Cumulative conntrack flows deleted by conntrack reconciler", StabilityLevel: metrics.ALPHA}, []string{"ip_family"}),
		Duration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Subsystem: "kubeproxy", Name: "conntrack_reconciler_sync_duration_seconds",
			Help:    "ReconcileConntrackFlowsLatency latency in seconds",
			Buckets: metrics.ExponentialBuckets(0.001, 2, 15), StabilityLevel: metrics.ALPHA}, []string{"ip_family"}),
	}
	if reg != nil {
		reg.MustRegister(m.Deleted, m.Duration)
	}
	return m
}

// observe records one cleanup: the flows deleted of each family, and the
// time it took, for each family (one pass cleans both).
func (m *Metrics) observe(stale []Flow, deleted int, took time.Duration) {
	v6 := 0
	for _, f := range stale {
		if f.OrigDst.Addr().Unmap().Is6() {
			v6++
		}
	}
	// A delete that failed part way reports how many went, not which:
	// they are counted as IPv4 first (an approximation of an error case).
	v4 := min(len(stale)-v6, deleted)
	m.Deleted.WithLabelValues(model.IPv4).Add(float64(v4))
	m.Deleted.WithLabelValues(model.IPv6).Add(float64(deleted - v4))
	for _, fam := range []string{model.IPv4, model.IPv6} {
		m.Duration.WithLabelValues(fam).Observe(took.Seconds())
	}
}

// Table is the conntrack table as the cleaner uses it: Conn in production,
// a fake in unit tests.
type Table interface {
	List(family, proto uint8) ([]Flow, error)
	Delete(flows []Flow) (int, error)
}

// Cleaner deletes stale flows after each applied sync. It is called from
// the sync loop's goroutine only.
type Cleaner struct {
	Table   Table
	Log     *slog.Logger
	Metrics *Metrics // may be nil
	// FullEvery makes a sync read the table even when nothing changed, at
	// most this often, to catch flows that raced a sync (0: never).
	FullEvery time.Duration
	// LocalAddrs lists the node's addresses (NodePort flows go to them);
	// nil means the addresses of the current network namespace.
	LocalAddrs func() ([]netip.Addr, error)

	// prev are the Targets of prevState, the State judged last.
	prev      *Targets
	prevState *model.State
	tracker   model.ChangeTracker
	lastScan  time.Time
}

// Result is what one Clean did.
type Result struct {
	Scanned bool // the table was read
	Flows   int  // UDP and SCTP entries read
	Deleted int
	Took    time.Duration
}

// Clean deletes the flows made stale by the sync that applied st. An
// error leaves the cleaner where it was, so the next call judges against
// the same previous State and deletes what this one could not.
func (c *Cleaner) Clean(st *model.State) (Result, error) {
	start := time.Now()
	cur := c.targets(st)
	var res Result
	if !NeedsScan(c.prev, cur) && (c.FullEvery <= 0 || time.Since(c.lastScan) < c.FullEvery) {
		c.prev, c.prevState = cur, st
		return res, nil
	}
	local, err := c.localAddrs()
	if err != nil {
		return res, err
	}
	judge := NewJudge(c.prev, cur, local)
	var stale []Flow
	for _, proto := range cur.protocols(c.prev) {
		// One dump per family: the kernel filters by protocol only within
		// a family, and skipping the (many) TCP entries there is cheaper
		// than one dump of everything.
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			flows, err := c.Table.List(family, proto)
			if err != nil {
				return res, fmt.Errorf("conntrack cleanup: %w", err)
			}
			res.Flows += len(flows)
			for _, f := range flows {
				if judge.Stale(f) {
					stale = append(stale, f)
				}
			}
		}
	}
	res.Scanned = true
	res.Deleted, err = c.Table.Delete(stale)
	res.Took = time.Since(start)
	if c.Metrics != nil {
		c.Metrics.observe(stale, res.Deleted, res.Took)
	}
	if err != nil {
		return res, fmt.Errorf("conntrack cleanup: %w", err)
	}
	c.prev, c.prevState, c.lastScan = cur, st, start
	if res.Deleted > 0 && c.Log != nil {
		c.Log.Info("deleted stale conntrack entries", "deleted", res.Deleted, "read", res.Flows, "took", res.Took)
	}
	return res, nil
}

// targets returns the Targets of st: those of the State judged last,
// updated with the service ports changed since (see Targets.Update).
func (c *Cleaner) targets(st *model.State) *Targets {
	if c.prev == nil || c.prevState == nil || st == nil {
		return NewTargets(st)
	}
	c.tracker.RecordAll(c.prevState)
	return c.prev.Update(c.prevState, st, c.tracker.Changes(st))
}

func (c *Cleaner) localAddrs() ([]netip.Addr, error) {
	if c.LocalAddrs != nil {
		return c.LocalAddrs()
	}
	return netns.Addrs()
}
