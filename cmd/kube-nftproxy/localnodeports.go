package main

import (
	"log/slog"
	"net/netip"
	"slices"

	"github.com/kube-nftproxy/kube-nftproxy/localnodeport"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
)

// gateLocalhostNodePorts is kube-proxy's alpha gate for localhost
// NodePorts in nftables mode, answered by a userspace proxy (KEP-6032).
const gateLocalhostNodePorts = "KubeProxyNFTablesLocalhostNodePorts"

// localhostFamilies are the loopback addresses on which nftables mode
// answers NodePorts in userspace: with the gate on, those of the families
// whose --nodeport-addresses name loopback explicitly (the keyword
// localhost, or a CIDR whose address is loopback: not all, 0.0.0.0/0), as
// upstream's ContainsExplicitLoopback.
func localhostFamilies(mode string, gates map[string]bool, cfg nft.Config) []netip.Addr {
	if mode != modeNFTables || !gateEnabled(gates, gateLocalhostNodePorts) {
		return nil
	}
	var out []netip.Addr
	for _, lo := range []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()} {
		if slices.ContainsFunc(cfg.NodePortAddresses, func(p netip.Prefix) bool { return p.Addr().IsLoopback() && p.Addr().Is4() == lo.Is4() }) {
			out = append(out, lo)
		}
	}
	return out
}

// localNodePorts starts a userspace proxy on each loopback address and
// returns what follows each applied State, and what closes them; nil when
// none is asked for.
func localNodePorts(addrs []netip.Addr, metrics *serve.Metrics, log *slog.Logger) (sync func(*model.State), closeAll func()) {
	if len(addrs) == 0 {
		return nil, nil
	}
	m := localnodeport.NewMetrics(metrics.Registry)
	var proxies []*localnodeport.Proxy
	for _, a := range addrs {
		family := "IPv4"
		if a.Is6() {
			family = "IPv6"
		}
		g, f := m.Listeners.WithLabelValues(family), m.ListenFailures.WithLabelValues(family)
		proxies = append(proxies, localnodeport.New(a, log, localnodeport.Observer{Listeners: func(n int) { g.Set(float64(n)) }, ListenFailed: f.Inc}))
	}
	log.Info("answering TCP NodePorts on localhost in userspace, without route_localnet", "gate", gateLocalhostNodePorts, "addresses", addrs)
	sync = func(st *model.State) {
		for i, p := range proxies {
			p.Sync(localnodeport.Ports(st, addrs[i].Is6()))
		}
	}
	closeAll = func() {
		for _, p := range proxies {
			p.Close()
		}
	}
	return sync, closeAll
}
