package conntrack

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/kube-nftproxy/kube-nftproxy/internal/errlog"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// keyCount is the number of entries in this network namespace's table;
// keyMax (tuning.go) is the limit, global to the node.
const keyCount = "net/netfilter/nf_conntrack_count"

// Fill is how full the conntrack table is: Entries of this network
// namespace (nf_conntrack_count) against the node's Limit
// (nf_conntrack_max; 0 means no limit). The kernel compares the two when a
// new flow comes: at the limit it evicts an entry not yet assured (no
// reply seen) if it finds one, else drops the packet and logs
// "nf_conntrack: table full, dropping packet".
type Fill struct {
	Entries, Limit int
}

// ReadFill reads the table's fill under s. An error wrapping
// fs.ErrNotExist means there is no conntrack in this kernel (nf_conntrack
// not loaded yet: the first nat rule loads it).
func ReadFill(s *sysctl.Sysctl) (Fill, error) {
	n, err := s.GetInt(keyCount)
	if err != nil {
		return Fill{}, err
	}
	limit, err := s.GetInt(keyMax)
	if err != nil {
		return Fill{}, err
	}
	return Fill{Entries: n, Limit: limit}, nil
}

// The pressure thresholds, in percent of the limit. A table at its limit
// is read just below it most of the time (entries expire between the
// drops), and it is read every PressureEvery: warning at the limit itself
// would miss most full tables. 90% is also where a burst of new
// connections (a few thousand on a default-sized table) fills the rest
// within a second. Room again below 80%, so that a table hovering around
// 90% warns once, not at every reading.
const (
	pressureHighPercent = 90
	pressureLowPercent  = 80
)

// PressureEvery is how often the proxy reads the table's fill.
const PressureEvery = 10 * time.Second

// high and low report whether f is at the warning threshold or below the
// one of having room again; a table without a limit is never either.
func (f Fill) high() bool { return f.Limit > 0 && f.Entries*100 >= f.Limit*pressureHighPercent }
func (f Fill) low() bool  { return f.Limit <= 0 || f.Entries*100 < f.Limit*pressureLowPercent }

// Pressure watches the conntrack table's fill: it serves it as two
// gauges and logs a warning once when the table nears its limit, and a
// note once it has room again.
type Pressure struct {
	// Sysctl is /proc/sys (tests: a temporary directory).
	Sysctl  *sysctl.Sysctl
	Log     *slog.Logger
	Metrics *PressureMetrics // may be nil

	mu      sync.Mutex
	high    errlog.Mark // warned, and no room again since
	lastErr string      // the last failure logged, so that it is logged once
}

// NewPressure watches this network namespace's table, with its gauges in
// reg.
func NewPressure(log *slog.Logger, reg metrics.KubeRegistry) *Pressure {
	return &Pressure{Sysctl: sysctl.New(sysctl.DefaultRoot), Log: log, Metrics: NewPressureMetrics(reg)}
}

// Run checks the fill at once and then every period until ctx ends.
func (p *Pressure) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.Check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check reads the fill once: the gauges follow it, and the log says when
// the table crossed a threshold. Without conntrack (the keys are missing)
// there are no gauges and nothing is logged; another failure is logged
// once, until a reading succeeds.
func (p *Pressure) Check() {
	f, err := ReadFill(p.Sysctl)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.Metrics.clear()
		if !errors.Is(err, fs.ErrNotExist) && err.Error() != p.lastErr {
			p.Log.Warn("cannot read the conntrack table's fill; kubenftproxy_conntrack_entries is not served meanwhile", "err", err)
			p.lastErr = err.Error()
		}
		return
	}
	p.lastErr = ""
	p.Metrics.Set(f)
	switch rose, fell := p.high.Update(f.high(), f.low()); {
	case rose:
		p.Log.Warn("conntrack table nearly full: at its limit the kernel drops packets of new connections (\"nf_conntrack: table full, dropping packet\"); raise nf_conntrack_max (--conntrack-max-per-core, --conntrack-min) or find what holds so many connections",
			"entries", f.Entries, "limit", f.Limit)
	case fell:
		p.Log.Info("conntrack table has room again", "entries", f.Entries, "limit", f.Limit)
	}
}

// PressureMetrics serves the last fill read: kubenftproxy_conntrack_entries
// and kubenftproxy_conntrack_entries_limit, as node_exporter's
// node_nf_conntrack_entries and node_nf_conntrack_entries_limit. Neither is
// served before a reading succeeds.
type PressureMetrics struct {
	metrics.BaseStableCollector
	entries, limit *metrics.Desc
	last           atomic.Pointer[Fill]
}

// NewPressureMetrics creates the gauges and registers them with reg.
func NewPressureMetrics(reg metrics.KubeRegistry) *PressureMetrics {
	desc := func(name, help string) *metrics.Desc {
		return metrics.NewDesc(metrics.BuildFQName("", "kubenftproxy", name), help, nil, nil, metrics.ALPHA, "")
	}
	m := &PressureMetrics{
		entries: desc("conntrack_entries", "Entries in the conntrack table of the proxy's network namespace (nf_conntrack_count)"),
		limit:   desc("conntrack_entries_limit", "nf_conntrack_max (0: none): at it, new connections are dropped"),
	}
	if reg != nil {
		reg.CustomMustRegister(m)
	}
	return m
}

func (m *PressureMetrics) clear() {
	if m != nil {
		m.last.Store(nil)
	}
}

// Set makes the gauges serve f (the metrics reference sets one).
func (m *PressureMetrics) Set(f Fill) {
	if m != nil {
		m.last.Store(&f)
	}
}

// DescribeWithStability describes the two gauges.
func (m *PressureMetrics) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- m.entries
	ch <- m.limit
}

// CollectWithStability serves the last fill read, if any.
func (m *PressureMetrics) CollectWithStability(ch chan<- metrics.Metric) {
	f := m.last.Load()
	if f == nil {
		return
	}
	ch <- metrics.NewLazyConstMetric(m.entries, metrics.GaugeValue, float64(f.Entries))
	ch <- metrics.NewLazyConstMetric(m.limit, metrics.GaugeValue, float64(f.Limit))
}
