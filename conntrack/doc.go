// Package conntrack keeps the kernel's connection tracking table in step
// with the Services: after each applied sync it deletes the UDP and SCTP
// flows that would otherwise stay pinned to an endpoint that is gone, or to
// the path taken before a Service had endpoints (stale.go decides, over a
// ctnetlink socket of our own in ctnetlink.go). It also applies kube-proxy's
// conntrack sysctl tuning (tuning.go), and watches how full the table is,
// warning before the kernel drops new connections (pressure.go).
package conntrack
