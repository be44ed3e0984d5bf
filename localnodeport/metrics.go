package localnodeport

import "k8s.io/component-base/metrics"

// Metrics are kube-proxy's metrics of its localhost NodePort proxy.
type Metrics struct {
	// Listeners is kubeproxy_nftables_localhost_nodeport_listeners.
	Listeners *metrics.GaugeVec
	// ListenFailures is
	// kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total.
	ListenFailures *metrics.CounterVec
}

// NewMetrics registers the metrics in reg, with kube-proxy's names.
func NewMetrics(reg metrics.KubeRegistry) *Metrics {
	m := &Metrics{
		Listeners: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Subsystem: "kubeproxy", Name: "nftables_localhost_nodeport_listeners",
			Help:           "Number of active localhost NodePort userspace proxy listeners.",
			StabilityLevel: metrics.ALPHA}, []string{"ip_family"}),
		ListenFailures: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem: "kubeproxy", Name: "nftables_localhost_nodeport_listener_creation_failures_total",
			Help:           "Number of localhost NodePort userspace proxy listener creation failures.",
			StabilityLevel: metrics.ALPHA}, []string{"ip_family"}),
	}
	reg.MustRegister(m.Listeners, m.ListenFailures)
	return m
}
