package main

import (
	"fmt"
	"log/slog"

	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// runInitOnly is --init-only: the node setup that needs full root
// privileges (the conntrack sysctls, route_localnet for localhost
// NodePorts, IPVS mode's sysctls), then exit, as kube-proxy does; the
// proxy can then run with CAP_NET_ADMIN only. Unlike kube-proxy, it needs
// no API server: nothing of it depends on the Node object. nftables is not
// touched but for the record of the sysctls changed (sysctlrecord).
func runInitOnly(o *options, log *slog.Logger) error {
	cfg, err := o.nftConfig()
	if err != nil {
		return err
	}
	applyOOMScoreAdj(oomScoreAdjPath, o.oomScoreAdj, log)
	var sys nodeSysctls
	if _, err := sys.tuner(log).Apply(o.conntrackTuning()); err != nil {
		return fmt.Errorf("could not set conntrack parameters: %w", err)
	}
	if _, err := ensureRouteLocalnet(sys.proc(), cfg, log); err != nil {
		return err
	}
	if o.proxyMode == modeIPVS {
		if err := ipvs.ApplySysctls(sys.proc(), o.ipvs.strictARP, log); err != nil {
			return fmt.Errorf("setting IPVS mode's sysctls: %w", err)
		}
	}
	recordSysctls(&sys, log)
	log.Info("system initialized and --init-only given; exiting", "mode", o.proxyMode)
	return nil
}

// recordSysctls records what --init-only changed, in the kernel's record
// of this network namespace.
func recordSysctls(sys *nodeSysctls, log *slog.Logger) {
	if len(sys.journal.Changes()) == 0 {
		return
	}
	k, err := nftlib.OpenKernel("")
	if err != nil {
		log.Warn("could not record the sysctls changed: --cleanup will not put them back", "err", err)
		return
	}
	defer k.Close()
	sys.record(k, log)
}
