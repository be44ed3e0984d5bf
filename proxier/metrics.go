package proxier

import (
	"net/http"
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
	}
	m.Registry.MustRegister(m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.LastSync,
		m.LastQueued, m.SyncFailures, m.NoLocalEndpoints,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observe records one sync attempt.
func (m *Metrics) Observe(res SyncResult, took time.Duration, err error) {
	if err != nil {
		m.SyncFailures.Inc()
		return
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
// none on this node (as kube-proxy counts them, per policy).
func (m *Metrics) CountNoLocalEndpoints(st *State) {
	internal, external := 0, 0
	for name, svc := range st.Services {
		if !svc.InternalPolicyLocal && !svc.ExternalPolicyLocal {
			continue
		}
		_, local, _, hasAny := CategorizeEndpoints(svc, st.Endpoints[name], st.Node)
		if !hasAny || len(local) > 0 {
			continue
		}
		if svc.InternalPolicyLocal {
			internal++
		}
		if svc.ExternalPolicyLocal {
			external++
		}
	}
	m.NoLocalEndpoints.WithLabelValues("internal").Set(float64(internal))
	m.NoLocalEndpoints.WithLabelValues("external").Set(float64(external))
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
