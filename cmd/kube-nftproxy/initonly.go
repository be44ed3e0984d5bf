package main

import (
	"fmt"
	"log/slog"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// runInitOnly is --init-only: the node setup that needs full root
// privileges (the conntrack sysctls, route_localnet for localhost
// NodePorts, IPVS mode's sysctls), then exit, as kube-proxy does; the
// proxy can then run with CAP_NET_ADMIN only. Unlike kube-proxy, it needs
// no API server: nothing of it depends on the Node object. nftables is not
// touched.
func runInitOnly(o *options, log *slog.Logger) error {
	cfg, err := o.nftConfig()
	if err != nil {
		return err
	}
	applyOOMScoreAdj(oomScoreAdjPath, o.oomScoreAdj, log)
	if _, err := conntrack.NewTuner(log).Apply(o.conntrackTuning()); err != nil {
		return fmt.Errorf("could not set conntrack parameters: %w", err)
	}
	if _, err := ensureRouteLocalnet(sysctl.New(""), cfg, log); err != nil {
		return err
	}
	if o.proxyMode == modeIPVS {
		if err := ipvs.ApplySysctls(sysctl.New(""), o.ipvs.strictARP, log); err != nil {
			return fmt.Errorf("setting IPVS mode's sysctls: %w", err)
		}
	}
	log.Info("system initialized and --init-only given; exiting", "mode", o.proxyMode)
	return nil
}
