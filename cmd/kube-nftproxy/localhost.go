package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

const (
	flagLocalhostNodePorts = "iptables-localhost-nodeports"
	// routeLocalnet lets the kernel route packets with a 127.0.0.0/8
	// source or destination off the loopback device: a localhost NodePort
	// DNATed to a pod keeps its 127.0.0.1 source until masqueraded.
	routeLocalnet = "net/ipv4/conf/all/route_localnet"
)

func (o *options) addLocalhostFlag(fs *pflag.FlagSet) {
	fs.BoolVar(&o.localhostNodePorts, flagLocalhostNodePorts, true,
		"with --proxy-mode iptables: serve IPv4 NodePorts on 127.0.0.0/8 too (sets net.ipv4.conf.all.route_localnet=1 when --nodeport-addresses includes loopback); ignored in the other modes")
}

// noteMode logs what the proxy mode means here (once, at start): iptables
// mode is its behaviour programmed as nftables rules; and, as kube-proxy
// ignores --iptables-localhost-nodeports outside iptables mode, a warning
// when it was asked for there.
func (o *options) noteMode(fs *pflag.FlagSet, log *slog.Logger) {
	set := o.localhostNodePortsSet || fs.Changed(flagLocalhostNodePorts)
	switch {
	case o.proxyMode == modeIPTables:
		how := "given"
		if o.modeDefaulted {
			how = "not set: iptables, kube-proxy's default on Linux"
		}
		log.Info("proxy mode iptables: kube-proxy's iptables mode behaviour (its chains, NodePorts on all addresses and, by default, on localhost), programmed as nftables rules",
			"mode", how, "localhostNodePorts", o.localhostNodePorts)
	case set && o.localhostNodePorts:
		log.Warn("--iptables-localhost-nodeports (iptables.localhostNodePorts) applies in iptables mode only; ignored", "mode", o.modeName())
	}
}

// modeName is the effective proxy mode's name: "" is iptables, as in
// kube-proxy on Linux.
func (o *options) modeName() string {
	if o.proxyMode == "" {
		return modeIPTables
	}
	return o.proxyMode
}

// ensureRouteLocalnet sets net.ipv4.conf.all.route_localnet=1 (in this
// network namespace) when cfg serves localhost NodePorts, as kube-proxy's
// iptables mode does, saying why. It returns cfg as it can be served:
// where /proc/sys is read-only (an unprivileged container) and the key is
// not already 1, localhost NodePorts are turned off with a warning, since
// without route_localnet they could not be answered; any other error is
// returned.
func ensureRouteLocalnet(s *sysctl.Sysctl, cfg nft.Config, log *slog.Logger) (nft.Config, error) {
	if !nft.LocalhostNodePorts(cfg) {
		return cfg, nil
	}
	if v, err := s.GetInt(routeLocalnet); err == nil && v == 1 {
		return cfg, nil
	}
	log.Info("setting route_localnet=1 to serve NodePorts on localhost; to change this, set --iptables-localhost-nodeports=false (iptables.localhostNodePorts) or leave loopback out of --nodeport-addresses")
	err := s.SetInt(routeLocalnet, 1)
	switch {
	case err == nil:
		return cfg, nil
	case errors.Is(err, sysctl.ErrReadOnly):
		log.Warn("cannot set route_localnet: NodePorts are not served on localhost (run privileged, or set the sysctl on the node)", "err", err)
		cfg.LocalhostNodePorts = false
		return cfg, nil
	}
	return cfg, fmt.Errorf("setting %s for localhost NodePorts: %w", routeLocalnet, err)
}
