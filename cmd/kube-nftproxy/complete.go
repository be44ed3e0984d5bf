package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// featureGate is one of kube-proxy's feature gates: its stage, its
// default, and whether it is locked to that default (GA or deprecated).
type featureGate struct {
	stage  string
	def    bool
	locked bool
}

// honouredGates are the feature gates that change what kube-nftproxy does;
// any other gate set away from its default is accepted, as kube-proxy
// accepts it, with a warning that it has no effect here.
var honouredGates = []string{"LoggingAlphaOptions", "LoggingBetaOptions", gateExternalIPs, gateLocalhostNodePorts}

// gateExternalIPs lets Services' spec.externalIPs be programmed (GA, on by
// default; KEP-5707 turns it off later).
const gateExternalIPs = "AllowServiceExternalIPs"

// gateEnabled is a feature gate's effective value: as gates sets it, else
// its default.
func gateEnabled(gates map[string]bool, name string) bool {
	if v, ok := gates[name]; ok {
		return v
	}
	return knownFeatureGates[name].def
}

// modelOptions are the options the feature gates give the Builder that
// turns Services into the model; log gets the notes on what
// they leave out.
func modelOptions(gates map[string]bool, log *slog.Logger) []kube.Option {
	return []kube.Option{kube.AllowExternalIPs(gateEnabled(gates, gateExternalIPs), log)}
}

// complete resolves the settings as kube-proxy does after reading flags and
// --config, before validating them: an empty proxy mode is iptables (its
// default on Linux), nftables mode's NodePort addresses default to primary,
// and the feature gates are those of the file or of --feature-gates (which
// --config overrides).
func (o *options) complete() error {
	if o.proxyMode == "" {
		o.proxyMode, o.modeDefaulted = modeIPTables, true
	}
	o.nodePortAddrs = o.effectiveNodePortAddrs()
	flagGates, err := parseFeatureGates(o.featureGates)
	if err != nil {
		return err
	}
	gates := maps.Clone(o.fileGates)
	if gates == nil {
		gates = map[string]bool{}
	}
	maps.Copy(gates, flagGates)
	if err := checkFeatureGates(gates); err != nil {
		return err
	}
	o.gates = gates
	return nil
}

// parseFeatureGates reads --feature-gates (Name=true,Other=false).
func parseFeatureGates(s string) (map[string]bool, error) {
	gates := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if !ok || err != nil {
			return nil, fmt.Errorf("--feature-gates %q: want Name=true|false", kv)
		}
		gates[strings.TrimSpace(k)] = b
	}
	return gates, nil
}

// checkFeatureGates refuses, with kube-proxy's messages, a gate it does not
// know and a locked gate set away from its default.
func checkFeatureGates(gates map[string]bool) error {
	for _, name := range slices.Sorted(maps.Keys(gates)) {
		g, ok := knownFeatureGates[name]
		switch {
		case !ok:
			return fmt.Errorf("unrecognized feature gate: %s", name)
		case g.locked && gates[name] != g.def:
			return fmt.Errorf("cannot set feature gate %s to %t, feature is locked to %t", name, gates[name], g.def)
		}
	}
	return nil
}

// noteGates logs the feature gates given, and warns of each one set away
// from its default that kube-nftproxy does not honour.
func (o *options) noteGates(log *slog.Logger) {
	if len(o.gates) == 0 {
		return
	}
	log.Info("feature gates", "gates", o.gates)
	for _, name := range slices.Sorted(maps.Keys(o.gates)) {
		if v := o.gates[name]; v != knownFeatureGates[name].def && !slices.Contains(honouredGates, name) {
			log.Warn("feature gate has no effect in kube-nftproxy; ignored", "gate", name, "value", v)
		}
	}
}

// Keywords of --nodeport-addresses, as kube-proxy's.
const (
	nodePortPrimary   = "primary"
	nodePortAll       = "all"
	nodePortLocalhost = "localhost"
)

// nodePortKeywords are what the keywords but primary stand for.
var nodePortKeywords = map[string][]netip.Prefix{
	nodePortAll:       {netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
	nodePortLocalhost: {netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
}

// effectiveNodePortAddrs is --nodeport-addresses with kube-proxy's
// default for the mode when empty: primary (the Node object's addresses)
// in nftables mode; in iptables and ipvs mode, all local addresses (left
// empty, as kube-proxy writes it).
func (o *options) effectiveNodePortAddrs() []string {
	if len(o.nodePortAddrs) == 0 && o.modeName() == modeNFTables {
		return []string{nodePortPrimary}
	}
	return o.nodePortAddrs
}

// parseNodePortAddresses reads --nodeport-addresses as kube-proxy does: any
// mix of CIDRs and the keywords primary (the Node object's addresses), all
// and localhost, each keyword at most once.
func parseNodePortAddresses(list []string) (prefixes []netip.Prefix, primary bool, err error) {
	seen := map[string]bool{}
	for _, a := range list {
		a = strings.TrimSpace(a)
		if _, keyword := nodePortKeywords[a]; keyword || a == nodePortPrimary {
			if seen[a] {
				return nil, false, fmt.Errorf("--nodeport-addresses: %q given twice", a)
			}
			seen[a] = true
		}
		if a == nodePortPrimary {
			primary = true
			continue
		}
		if ps, ok := nodePortKeywords[a]; ok {
			prefixes = append(prefixes, ps...)
			continue
		}
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, false, fmt.Errorf("--nodeport-addresses %q: must be a valid CIDR or one of %q, %q, %q", a, nodePortPrimary, nodePortAll, nodePortLocalhost)
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, primary, nil
}

// addCompatFlags adds kube-proxy's flags this file implements.
func (o *options) addCompatFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.initOnly, "init-only", false, "do the setup that needs full root privileges (conntrack sysctls, route_localnet, IPVS's sysctls), then exit; the proxy can then run with CAP_NET_ADMIN only")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", 15*time.Minute, "how often the Services, EndpointSlices and Nodes read from the API server are resynced; must be greater than 0")
}

// checkConfigSyncPeriod is kube-proxy's rule for --config-sync-period.
func (o *options) checkConfigSyncPeriod() error {
	if o.configSyncPeriod <= 0 {
		return fmt.Errorf("--config-sync-period %s: must be greater than 0", o.configSyncPeriod)
	}
	return nil
}

// completeHostname takes --hostname-override as kube-proxy does: trimmed
// and lower-cased, and refused when blank.
func (o *options) completeHostname(fs *pflag.FlagSet) error {
	if !fs.Changed("hostname-override") || o.hostnameOverride == "" {
		return nil
	}
	h := strings.ToLower(strings.TrimSpace(o.hostnameOverride))
	if h == "" {
		return errors.New("empty hostname-override is invalid")
	}
	o.hostnameOverride = h
	return nil
}

// checkBindAddresses validates the addresses as kube-proxy does: the
// health and metrics servers' an IP and port (or empty: disabled), the
// node address hint an IP.
func (o *options) checkBindAddresses() error {
	for _, a := range []struct{ name, addr string }{{"healthz-bind-address", o.healthzAddress}, {"metrics-bind-address", o.metricsAddress}} {
		if a.addr == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			return fmt.Errorf("--%s %q: must be IP:port: %w", a.name, a.addr, err)
		}
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("--%s %q: %q must be a valid IP", a.name, a.addr, host)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("--%s %q: must be a valid port number", a.name, a.addr)
		}
	}
	if _, err := netip.ParseAddr(o.bindAddress); err != nil {
		return fmt.Errorf("--bind-address %q: must be a valid IP", o.bindAddress)
	}
	return nil
}
