// Package conntrack deletes stale UDP and SCTP flows over ctnetlink after a
// sync and tunes the conntrack sysctls as kube-proxy does. It is built in a
// later milestone; the package exists so the layout matches the design.
package conntrack
