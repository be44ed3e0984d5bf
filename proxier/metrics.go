package proxier

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are kube-proxy's sync metrics, with its names, in a registry of
// their own (no global state).
type Metrics struct {
	Registry *prometheus.Registry

	SyncDuration        prometheus.Histogram
	SyncFullDuration    prometheus.Histogram
	SyncPartialDuration prometheus.Histogram
	LastSync            prometheus.Gauge
	LastQueued          prometheus.Gauge
	SyncFailures        prometheus.Counter
	NoLocalEndpoints    *prometheus.GaugeVec
	// NetworkProgramming is kubeproxy_network_programming_duration_seconds:
	// per EndpointSlice change with a trigger time, how long after it the
	// sync that programmed it succeeded (see Syncing).
	NetworkProgramming prometheus.Histogram
	// ProxyHealthz and ProxyLivez count the answers of /healthz and
	// /livez by HTTP status code (see CountProbe).
	ProxyHealthz, ProxyLivez *prometheus.CounterVec

	// Ours, for what kube-proxy does not measure: failures to read the
	// source of Services (by source), whether it reads fine now, and
	// the times the kernel's rules differed from what we wrote (by table).
	SourceFailures *prometheus.CounterVec
	SourceUp       *prometheus.GaugeVec
	DriftRepairs   *prometheus.CounterVec
	// HTTPConnsDropped counts the connections to our HTTP servers closed
	// for ConnGuard's caps, by server and reason (ConnGuard.OnDropped).
	HTTPConnsDropped *prometheus.CounterVec

	changes *changeCollector
	now     func() time.Time

	mu       sync.Mutex
	triggers []time.Time // of the State being synced, for the next Observe

	noLocal noLocalIndex // CountNoLocalEndpoints's counts, kept between calls
}

// NewMetrics creates and registers the metrics.
func NewMetrics() *Metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15) // 1 ms to 16 s, as kube-proxy
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds", Buckets: buckets}),
		SyncFullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubeproxy", Name: "sync_full_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds for full resyncs", Buckets: buckets}),
		SyncPartialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubeproxy", Name: "sync_partial_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds for partial resyncs", Buckets: buckets}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}),
		LastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued"}),
		SyncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_nftables_sync_failures_total",
			Help: "Cumulative proxy nftables sync failures"}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy"}),
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubeproxy", Name: "network_programming_duration_seconds",
			Help: "In Cluster Network Programming Latency in seconds", Buckets: networkProgrammingBuckets()}),
		ProxyHealthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		ProxyLivez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status"}, []string{"code"}),
		SourceFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubenftproxy", Name: "source_failures_total",
			Help: "Failures to read the source of Services (API server, state files); the rules keep the last good view"}, []string{"source"}),
		SourceUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubenftproxy", Name: "source_up",
			Help: "1 when the source of Services reads fine, 0 while it fails"}, []string{"source"}),
		DriftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubenftproxy", Name: "drift_repairs_total",
			Help: "Times our nftables tables differed from what was written and were rewritten"}, []string{"table"}),
		HTTPConnsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubenftproxy", Name: "http_connections_dropped_total",
			Help: "Connections to the health, metrics and health check node port servers closed for the connection caps: evicted (idle, closed to make room) or refused (closed at once, all busy)"},
			[]string{"server", "reason"}),
		changes: newChangeCollector(),
		now:     time.Now,
	}
	m.Registry.MustRegister(m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.LastSync,
		m.LastQueued, m.SyncFailures, m.NoLocalEndpoints, m.NetworkProgramming, m.changes, m.ProxyHealthz, m.ProxyLivez,
		m.SourceFailures, m.SourceUp, m.DriftRepairs, m.HTTPConnsDropped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// CountDroppedConn counts one connection closed for the caps
// (ConnGuard.OnDropped).
func (m *Metrics) CountDroppedConn(server, reason string) {
	m.HTTPConnsDropped.WithLabelValues(server, reason).Inc()
}

// networkProgrammingBuckets are kube-proxy's: 0, then 0.25 s and 0.5 s,
// every second up to 59 s, every 5 s up to 115 s, every 30 s from 2 to 5
// minutes.
func networkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
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

// Syncing hands over the trigger times of the EndpointSlice changes in the
// State about to be synced (informers.Builder.StateWithTriggers). The next
// Observe records them in NetworkProgramming if that sync succeeded and
// drops them if it failed: as in kube-proxy, a change whose sync failed is
// not measured, even once a retry programs it.
func (m *Metrics) Syncing(triggers []time.Time) {
	m.mu.Lock()
	m.triggers = triggers
	m.mu.Unlock()
}

// Observe records one sync attempt.
func (m *Metrics) Observe(res SyncResult, took time.Duration, err error) {
	m.mu.Lock()
	triggers := m.triggers
	m.triggers = nil
	m.mu.Unlock()
	if err != nil {
		m.SyncFailures.Inc()
		return
	}
	now := m.now()
	for _, t := range triggers {
		m.NetworkProgramming.Observe(now.Sub(t).Seconds())
	}
	m.SyncDuration.Observe(took.Seconds())
	if res.Full {
		m.SyncFullDuration.Observe(took.Seconds())
	} else {
		m.SyncPartialDuration.Observe(took.Seconds())
	}
	m.LastSync.SetToCurrentTime()
}

// CountNoLocalEndpoints sets kubeproxy_sync_proxy_rules_no_local_endpoints_total:
// the service ports with a Local traffic policy that have endpoints, but
// none on this node (as kube-proxy counts them, per policy). Called with
// each applied State, from one goroutine; it looks at the service ports
// changed since the last call only.
func (m *Metrics) CountNoLocalEndpoints(st *State) {
	m.noLocal.update(st, noLocalBuckets)
	m.NoLocalEndpoints.WithLabelValues("internal").Set(float64(m.noLocal.counts[0]))
	m.NoLocalEndpoints.WithLabelValues("external").Set(float64(m.noLocal.counts[1]))
}

// ChangeCounts are the Service and EndpointSlice events a source has seen,
// for kube-proxy's change metrics.
type ChangeCounts struct {
	// ServiceChanges and EndpointChanges count every event since the
	// source started, whether or not it changed anything
	// (kubeproxy_sync_proxy_rules_{service,endpoint}_changes_total).
	ServiceChanges, EndpointChanges uint64
	// ServicesPending is the number of Services that differ from what the
	// last sync took; EndpointChangesPending the number of EndpointSlice
	// events since then that changed a slice
	// (kubeproxy_sync_proxy_rules_{service,endpoint}_changes_pending).
	ServicesPending, EndpointChangesPending int
}

// CountChanges makes the four change metrics read source at every scrape
// (informers.Builder.ChangeCounts). Without a source, as with the file
// source, they stay 0.
func (m *Metrics) CountChanges(source func() ChangeCounts) {
	m.changes.source.Store(&source)
}

// changeCollector exports a source's ChangeCounts as kube-proxy's
// change metrics, read when scraped.
type changeCollector struct {
	source                                                           atomic.Pointer[func() ChangeCounts]
	endpointsPending, endpointsTotal, servicesPending, servicesTotal *prometheus.Desc
}

func newChangeCollector() *changeCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("", "kubeproxy", name), help, nil, nil)
	}
	return &changeCollector{
		endpointsPending: desc("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"),
		endpointsTotal:   desc("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"),
		servicesPending:  desc("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"),
		servicesTotal:    desc("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"),
	}
}

func (c *changeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.endpointsPending
	ch <- c.endpointsTotal
	ch <- c.servicesPending
	ch <- c.servicesTotal
}

func (c *changeCollector) Collect(ch chan<- prometheus.Metric) {
	var n ChangeCounts
	if f := c.source.Load(); f != nil {
		n = (*f)()
	}
	ch <- prometheus.MustNewConstMetric(c.endpointsPending, prometheus.GaugeValue, float64(n.EndpointChangesPending))
	ch <- prometheus.MustNewConstMetric(c.endpointsTotal, prometheus.CounterValue, float64(n.EndpointChanges))
	ch <- prometheus.MustNewConstMetric(c.servicesPending, prometheus.GaugeValue, float64(n.ServicesPending))
	ch <- prometheus.MustNewConstMetric(c.servicesTotal, prometheus.CounterValue, float64(n.ServiceChanges))
}

// Handler serves /metrics, and /proxyMode as kube-proxy's metrics server does.
func (m *Metrics) Handler(mode string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(mode))
	})
	return mux
}
