package kube

import (
	"log/slog"
	"net/netip"
	"slices"
)

// Option changes how a Builder reads Services. The zero set of options is
// kube-proxy's defaults.
type Option func(*builderOptions)

// builderOptions are the settings the Options set.
type builderOptions struct {
	// dropExternalIPs leaves every Service's spec.externalIPs out of the
	// State (kube-proxy's feature gate AllowServiceExternalIPs off).
	dropExternalIPs bool
	// log gets the notes on what the options left out.
	log *slog.Logger
}

// AllowExternalIPs is kube-proxy's feature gate AllowServiceExternalIPs
// (KEP-5707): with allowed false, no Service's spec.externalIPs reach the
// State, so no mode programs them, as kube-proxy then programs none. log
// (nil: discarded) gets one line for each Service whose external IPs are
// left out, when the Builder first sees it and again each time its ports
// or external IPs change; a resync of an unchanged Service logs nothing.
func AllowExternalIPs(allowed bool, log *slog.Logger) Option {
	return func(o *builderOptions) {
		o.dropExternalIPs = !allowed
		if log != nil {
			o.log = log
		}
	}
}

func newBuilderOptions(opts []Option) builderOptions {
	o := builderOptions{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// msgExternalIPsIgnored is the line logged for a Service whose external IPs
// are left out. Upstream kube-proxy logs nothing when it ignores them.
const msgExternalIPsIgnored = "Ignoring the Service's externalIPs: feature gate AllowServiceExternalIPs is disabled"

// noteIgnoredLocked records the external IPs a Service's latest version
// had left out, and reports whether to log them: when there are some and
// either the Service changed (as the proxy sees it) or they did.
func (b *Builder) noteIgnoredLocked(key serviceKey, ignored []netip.Addr, changed bool) bool {
	if len(ignored) == 0 {
		delete(b.ignoredIPs, key)
		return false
	}
	before, had := b.ignoredIPs[key]
	b.ignoredIPs[key] = ignored
	return changed || !had || !slices.Equal(before, ignored)
}

// logIgnored writes msgExternalIPsIgnored for one Service.
func (b *Builder) logIgnored(key serviceKey, ignored []netip.Addr) {
	ips := make([]string, len(ignored))
	for i, ip := range ignored {
		ips[i] = ip.String()
	}
	b.opts.log.Info(msgExternalIPsIgnored, "service", ObjectName(key.namespace, key.name), "externalIPs", ips)
}
