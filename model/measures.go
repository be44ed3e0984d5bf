package model

import "time"

// What a source hands over for the metrics (package serve) besides the
// State: when the changes a sync programs happened, and how many events
// it has seen.

// IP families, as kube-proxy's ip_family label names them.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Trigger is when a change that a sync programs happened (an
// EndpointSlice's last-change-trigger-time) and the IP family of its
// slice.
type Trigger struct {
	At     time.Time
	Family string // IPv4 or IPv6
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
