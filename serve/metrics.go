package serve

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// families are the IP families every sync programs: one transaction
// writes both, where kube-proxy runs a proxier per family.
var families = []string{model.IPv4, model.IPv6}

// Metrics are kube-proxy's sync metrics, with its names, labels and
// stability levels (component-base's "[ALPHA] " help prefix), in a
// registry of their own (no global state; Handler adds the process-wide
// ones: client-go's, build info, Go and process collectors).
type Metrics struct {
	Registry metrics.KubeRegistry

	SyncDuration        *metrics.HistogramVec
	SyncFullDuration    *metrics.HistogramVec
	SyncPartialDuration *metrics.HistogramVec
	LastSync            *metrics.GaugeVec
	LastQueued          *metrics.GaugeVec
	// SyncFailures is the mode's failure counter: nftables mode's
	// sync_proxy_rules_nftables_sync_failures_total, iptables and ipvs
	// modes' sync_proxy_rules_iptables_restore_failures_total (what
	// failed, for us, is the nftables transaction).
	SyncFailures     *metrics.CounterVec
	NoLocalEndpoints *metrics.GaugeVec
	// NetworkProgramming is kubeproxy_network_programming_duration_seconds:
	// per EndpointSlice change with a trigger time, how long after it the
	// sync that programmed it succeeded (see Syncing).
	NetworkProgramming *metrics.HistogramVec
	// ProxyHealthz and ProxyLivez count the answers of /healthz and
	// /livez by HTTP status code (see CountProbe).
	ProxyHealthz, ProxyLivez *metrics.CounterVec

	// Ours, for what kube-proxy does not measure: failures to read the
	// source of Services (by source), whether it reads fine now, and
	// the times the kernel's rules differed from what we wrote (by table).
	SourceFailures *metrics.CounterVec
	SourceUp       *metrics.GaugeVec
	DriftRepairs   *metrics.CounterVec
	// SyncFailing is 1 while syncs fail (since the last one that
	// succeeded): the kernel holds other rules than the proxy wants.
	SyncFailing *metrics.Gauge
	// HTTPConnsDropped counts the connections to our HTTP servers closed
	// for ConnGuard's caps or for a request body, by server and reason
	// (ConnGuard.OnDropped).
	HTTPConnsDropped *metrics.CounterVec

	changes *changeCollector
	now     func() time.Time

	mu       sync.Mutex
	triggers []model.Trigger // of the State being synced, for the next Observe

	noLocal noLocalIndex // CountNoLocalEndpoints's counts, kept between calls
}

// NewMetrics creates and registers the metrics of nftables mode.
func NewMetrics() *Metrics { return NewModeMetrics("nftables") }

// NewModeMetrics creates and registers the metrics kube-proxy registers in
// mode (nftables, iptables or ipvs), and ours.
func NewModeMetrics(mode string) *Metrics { return NewModeMetricsIn(mode, metrics.NewKubeRegistry()) }

// NewModeMetricsIn is NewModeMetrics registering in reg: the metrics
// reference (docs/metrics.md) passes one that records what is registered.
func NewModeMetricsIn(mode string, reg metrics.KubeRegistry) *Metrics {
	m := &Metrics{Registry: reg, changes: newChangeCollector(), now: time.Now}
	m.SyncDuration = histogramVec("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets(), familyLabel...)
	m.SyncFullDuration = histogramVec("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets(), familyLabel...)
	m.SyncPartialDuration = histogramVec("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets(), familyLabel...)
	m.LastSync = gaugeVec("kubeproxy", "sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", familyLabel...)
	m.LastQueued = gaugeVec("kubeproxy", "sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", familyLabel...)
	m.NoLocalEndpoints = gaugeVec("kubeproxy", "sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints", "ip_family", "traffic_policy")
	m.NetworkProgramming = histogramVec("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", networkProgrammingBuckets(), familyLabel...)
	m.ProxyHealthz = counterVec("kubeproxy", "proxy_healthz_total", "Cumulative proxy healthz HTTP status", "code")
	m.ProxyLivez = counterVec("kubeproxy", "proxy_livez_total", "Cumulative proxy livez HTTP status", "code")
	m.SourceFailures = counterVec("kubenftproxy", "source_failures_total", "Failures to read the source of Services (API server, state files); the rules keep the last good view", "source")
	m.SourceUp = gaugeVec("kubenftproxy", "source_up", "1 when the source of Services reads fine, 0 while it fails", "source")
	m.DriftRepairs = counterVec("kubenftproxy", "drift_repairs_total", "Times our nftables tables differed from what was written and were rewritten", "table")
	m.SyncFailing = metrics.NewGauge(&metrics.GaugeOpts{Subsystem: "kubenftproxy", Name: "sync_failing",
		Help:           "1 while syncs fail (since the last successful one): the kernel does not hold the rules the proxy wants",
		StabilityLevel: metrics.ALPHA})
	m.HTTPConnsDropped = counterVec("kubenftproxy", "http_connections_dropped_total",
		"Connections to the health, metrics and health check node port servers closed for the connection caps: evicted (idle, closed to make room) or refused (closed at once, all busy); or answered 413 and closed: body (a request with a body)",
		"server", "reason")
	m.Registry.MustRegister(m.SyncDuration, m.LastSync, m.LastQueued, m.NoLocalEndpoints, m.NetworkProgramming,
		m.ProxyHealthz, m.ProxyLivez, m.SourceFailures, m.SourceUp, m.DriftRepairs, m.SyncFailing, m.HTTPConnsDropped,
		m.SyncFullDuration, m.SyncPartialDuration)
	m.Registry.CustomMustRegister(m.changes)
	m.registerModeFailures(mode)
	return m
}

// registerModeFailures registers the failure counters kube-proxy has in
// mode. Ours count failed transactions; nftables mode's cleanup failures
// stay 0 (stale chains go in the same transaction), as does iptables
// mode's partial restore failures (there is no partial restore).
func (m *Metrics) registerModeFailures(mode string) {
	switch mode {
	case "iptables":
		m.SyncFailures = counterVec("kubeproxy", "sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", familyLabel...)
		m.Registry.MustRegister(m.SyncFailures, counterVec("kubeproxy", "sync_proxy_rules_iptables_partial_restore_failures_total",
			"Cumulative proxy iptables partial restore failures", familyLabel...))
	case "ipvs":
		m.SyncFailures = counterVec("kubeproxy", "sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", familyLabel...)
		m.Registry.MustRegister(m.SyncFailures)
	default:
		m.SyncFailures = counterVec("kubeproxy", "sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", familyLabel...)
		m.Registry.MustRegister(m.SyncFailures, counterVec("kubeproxy", "sync_proxy_rules_nftables_cleanup_failures_total",
			"Cumulative proxy nftables cleanup failures", familyLabel...))
	}
}

// familyLabel is kube-proxy's label of per-family metrics.
var familyLabel = []string{"ip_family"}

// syncBuckets are kube-proxy's sync latency buckets: 1 ms to 16 s.
func syncBuckets() []float64 { return metrics.ExponentialBuckets(0.001, 2, 15) }

func histogramVec(name, help string, buckets []float64, labels ...string) *metrics.HistogramVec {
	return metrics.NewHistogramVec(&metrics.HistogramOpts{Subsystem: "kubeproxy", Name: name, Help: help,
		Buckets: buckets, StabilityLevel: metrics.ALPHA}, labels)
}

func gaugeVec(subsystem, name, help string, labels ...string) *metrics.GaugeVec {
	return metrics.NewGaugeVec(&metrics.GaugeOpts{Subsystem: subsystem, Name: name, Help: help, StabilityLevel: metrics.ALPHA}, labels)
}

func counterVec(subsystem, name, help string, labels ...string) *metrics.CounterVec {
	return metrics.NewCounterVec(&metrics.CounterOpts{Subsystem: subsystem, Name: name, Help: help, StabilityLevel: metrics.ALPHA}, labels)
}

// CountDroppedConn counts one connection closed for the caps or for a
// request body (ConnGuard.OnDropped).
func (m *Metrics) CountDroppedConn(server, reason string) {
	m.HTTPConnsDropped.WithLabelValues(server, reason).Inc()
}

// networkProgrammingBuckets are kube-proxy's: 0, then 0.25 s and 0.5 s,
// every second up to 59 s, every 5 s up to 115 s, every 30 s from 2 to 5
// minutes.
func networkProgrammingBuckets() []float64 {
	return metrics.MergeBuckets(metrics.LinearBuckets(0.25, 0.25, 2), metrics.LinearBuckets(1, 1, 59),
		metrics.LinearBuckets(60, 5, 12), metrics.LinearBuckets(120, 30, 7))
}

// CountProbe counts one answer of the health server (Health.Answered):
// probe is "healthz" or "livez", code the HTTP status, as kube-proxy's
// label ("200", "503").
func (m *Metrics) CountProbe(probe string, code int) {
	c := m.ProxyHealthz
	if probe == "livez" {
		c = m.ProxyLivez
	}
	c.WithLabelValues(strconv.Itoa(code)).Inc()
}

// Queued records that a sync was queued, for every family.
func (m *Metrics) Queued() {
	now := float64(m.now().UnixNano()) / 1e9
	for _, f := range families {
		m.LastQueued.WithLabelValues(f).Set(now)
	}
}

// Syncing hands over the trigger times of the EndpointSlice changes in the
// State about to be synced (kube.Builder.StateWithFamilyTriggers). The next
// Observe records them in NetworkProgramming if that sync succeeded and
// drops them if it failed: as in kube-proxy, a change whose sync failed is
// not measured, even once a retry programs it.
func (m *Metrics) Syncing(triggers []model.Trigger) {
	m.mu.Lock()
	m.triggers = triggers
	m.mu.Unlock()
}

// Observe records one sync attempt. One transaction programs both IP
// families, so each family's series records it, as kube-proxy's two
// proxiers would.
func (m *Metrics) Observe(res proxier.SyncResult, took time.Duration, err error) {
	m.mu.Lock()
	triggers := m.triggers
	m.triggers = nil
	m.mu.Unlock()
	if err != nil {
		for _, f := range families {
			m.SyncFailures.WithLabelValues(f).Inc()
		}
		m.SyncFailing.Set(1)
		return
	}
	m.SyncFailing.Set(0)
	now := m.now()
	for _, t := range triggers {
		m.NetworkProgramming.WithLabelValues(t.Family).Observe(now.Sub(t.At).Seconds())
	}
	kind := m.SyncPartialDuration
	if res.Full {
		kind = m.SyncFullDuration
	}
	for _, f := range families {
		m.SyncDuration.WithLabelValues(f).Observe(took.Seconds())
		kind.WithLabelValues(f).Observe(took.Seconds())
		m.LastSync.WithLabelValues(f).Set(float64(now.UnixNano()) / 1e9)
	}
}

// CountNoLocalEndpoints sets kubeproxy_sync_proxy_rules_no_local_endpoints_total:
// per IP family, the service ports with a Local traffic policy that have
// endpoints of that family, but none on this node (as kube-proxy's
// proxier of each family counts them, per policy). Called with each
// applied State, from one goroutine; it looks at the service ports changed
// since the last call only.
func (m *Metrics) CountNoLocalEndpoints(st *model.State) {
	m.noLocal.update(st, noLocalBuckets)
	for fi, fam := range families {
		m.NoLocalEndpoints.WithLabelValues(fam, "internal").Set(float64(m.noLocal.counts[2*fi]))
		m.NoLocalEndpoints.WithLabelValues(fam, "external").Set(float64(m.noLocal.counts[2*fi+1]))
	}
}

// endpointsOf are the endpoints of one IP family.
func endpointsOf(eps []model.Endpoint, v6 bool) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range eps {
		if e.Addr.Unmap().Is6() == v6 {
			out = append(out, e)
		}
	}
	return out
}

// CountChanges makes the four change metrics read source at every scrape
// (informers.Builder.ChangeCounts). Without a source, as with the file
// source, they stay 0.
func (m *Metrics) CountChanges(source func() model.ChangeCounts) {
	m.changes.source.Store(&source)
}

// changeCollector exports a source's ChangeCounts as kube-proxy's
// change metrics, read when scraped.
type changeCollector struct {
	metrics.BaseStableCollector
	source                                                           atomic.Pointer[func() model.ChangeCounts]
	endpointsPending, endpointsTotal, servicesPending, servicesTotal *metrics.Desc
}

func newChangeCollector() *changeCollector {
	desc := func(name, help string) *metrics.Desc {
		return metrics.NewDesc(metrics.BuildFQName("", "kubeproxy", name), help, nil, nil, metrics.ALPHA, "")
	}
	return &changeCollector{
		endpointsPending: desc("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"),
		endpointsTotal:   desc("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"),
		servicesPending:  desc("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"),
		servicesTotal:    desc("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"),
	}
}

func (c *changeCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- c.endpointsPending
	ch <- c.endpointsTotal
	ch <- c.servicesPending
	ch <- c.servicesTotal
}

func (c *changeCollector) CollectWithStability(ch chan<- metrics.Metric) {
	var n model.ChangeCounts
	if f := c.source.Load(); f != nil {
		n = (*f)()
	}
	ch <- metrics.NewLazyConstMetric(c.endpointsPending, metrics.GaugeValue, float64(n.EndpointChangesPending))
	ch <- metrics.NewLazyConstMetric(c.endpointsTotal, metrics.CounterValue, float64(n.EndpointChanges))
	ch <- metrics.NewLazyConstMetric(c.servicesPending, metrics.GaugeValue, float64(n.ServicesPending))
	ch <- metrics.NewLazyConstMetric(c.servicesTotal, metrics.CounterValue, float64(n.ServiceChanges))
}

// Gatherer is what /metrics serves: this registry's families and the
// process-wide ones (see processMetrics).
func (m *Metrics) Gatherer() prometheus.Gatherer {
	return prometheus.Gatherers{m.Registry, legacyregistry.DefaultGatherer}
}

// Handler serves /metrics, and /proxyMode as kube-proxy's metrics server
// does. The metrics server's other paths are added by its caller
// (cmd/kube-nftproxy: /healthz, /configz, /flagz, /statusz, pprof).
func (m *Metrics) Handler(mode string) http.Handler {
	mux := http.NewServeMux()
	m.Register(mux, mode)
	return mux
}

// Register adds /metrics and /proxyMode to mux.
func (m *Metrics) Register(mux *http.ServeMux, mode string) {
	mux.Handle("/metrics", promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(mode))
	})
}
