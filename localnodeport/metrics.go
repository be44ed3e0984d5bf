package localnodeport

import "k8s.io/component-base/metrics"

// NewListenersGauge registers kube-proxy's
// kubeproxy_localhost_nodeport_listeners{ip_family} in reg.
func NewListenersGauge(reg metrics.KubeRegistry) *metrics.GaugeVec {
	g := metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "kubeproxy", Name: "localhost_nodeport_listeners",
		Help:           "Number of localhost NodePort listeners the userspace proxy holds",
		StabilityLevel: metrics.ALPHA}, []string{"ip_family"})
	reg.MustRegister(g)
	return g
}
