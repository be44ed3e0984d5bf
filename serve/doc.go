// Package serve is what the proxy serves over HTTP, and what those servers
// report: the health server's /healthz, /livez and /readyz (Health), the
// metrics server's /metrics and /proxyMode (Metrics, kube-proxy's sync
// metrics and ours), the healthCheckNodePort of every
// externalTrafficPolicy Local Service (HealthChecks), and the ConnGuard
// that counts and caps all those servers' connections together. A source
// of Services reports its failures to a SourceStatus, which tells Health
// and Metrics.
//
// The servers follow the proxier's sync loop: cmd/kube-nftproxy wires
// Loop.OnQueued, OnSync and OnApplied to them. Package proxier imports
// nothing of this one.
package serve
