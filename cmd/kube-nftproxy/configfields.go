package main

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

type kubeProxyConfig = proxyconfig.KubeProxyConfiguration

// configField ties one flag to its KubeProxyConfiguration field: --config
// takes the field, when the file sets it (any flag for it given is
// ignored, as kube-proxy ignores it), and
// --write-config-to writes the effective value back. One list of them,
// configFields, serves both, so a setting cannot be read and not written,
// or the reverse.
type configField struct {
	flag string
	// load copies the field into o if the file sets it (a zero value or a
	// nil pointer does not); nil for a field that is only written.
	load  func(c *kubeProxyConfig, o *options)
	store func(o *options, c *kubeProxyConfig)
}

// configFields are the settings --config and --write-config-to share.
func configFields() []configField {
	var all []configField
	for _, group := range [][]configField{generalFields(), nftablesFields(), ipvsFields(), conntrackFields(), serverFields()} {
		all = append(all, group...)
	}
	return all
}

// generalFields are the settings outside the mode and conntrack sections.
func generalFields() []configField {
	type c = kubeProxyConfig
	return []configField{
		// bindAddress is only accepted for compatibility (and validated).
		same("bind-address", func(o *options) *string { return &o.bindAddress }, func(c *c) *string { return &c.BindAddress }),
		text("proxy-mode", func(o *options) *string { return &o.proxyMode }, func(c *c) *proxyconfig.ProxyMode { return &c.Mode }),
		same("hostname-override", func(o *options) *string { return &o.hostnameOverride }, func(c *c) *string { return &c.HostnameOverride }),
		same("cluster-cidr", func(o *options) *string { return &o.clusterCIDR }, func(c *c) *string { return &c.ClusterCIDR }),
		same("healthz-bind-address", func(o *options) *string { return &o.healthzAddress }, func(c *c) *string { return &c.HealthzBindAddress }),
		same("metrics-bind-address", func(o *options) *string { return &o.metricsAddress }, func(c *c) *string { return &c.MetricsBindAddress }),
		same("kubeconfig", func(o *options) *string { return &o.kubeconfig }, func(c *c) *string { return &c.ClientConnection.Kubeconfig }),
		same("kube-api-content-type", func(o *options) *string { return &o.apiContentType }, func(c *c) *string { return &c.ClientConnection.ContentType }),
		same("kube-api-qps", func(o *options) *float32 { return &o.apiQPS }, func(c *c) *float32 { return &c.ClientConnection.QPS }),
		integer("kube-api-burst", func(o *options) *int { return &o.apiBurst }, func(c *c) *int32 { return &c.ClientConnection.Burst }),
		text("detect-local-mode", func(o *options) *string { return &o.detectLocalMode }, func(c *c) *proxyconfig.LocalMode { return &c.DetectLocalMode }),
		same("pod-bridge-interface", func(o *options) *string { return &o.bridgeInterface }, func(c *c) *string { return &c.DetectLocal.BridgeInterface }),
		same("pod-interface-name-prefix", func(o *options) *string { return &o.ifacePrefix }, func(c *c) *string { return &c.DetectLocal.InterfaceNamePrefix }),
		list("nodeport-addresses", func(o *options) *[]string { return &o.nodePortAddrs }, func(c *c) *[]string { return &c.NodePortAddresses }),
		pointer("oom-score-adj", func(o *options) *int32 { return &o.oomScoreAdj }, func(c *c) **int32 { return &c.OOMScoreAdj }),
		same("config-sync-period", func(o *options) *time.Duration { return &o.configSyncPeriod }, func(c *c) *time.Duration { return &c.ConfigSyncPeriod.Duration }),
		featureGatesField(),
	}
}

// nftablesFields are the settings of the mode's section, as upstream's
// v1alpha1 reads and writes them: the proxy mode picks the section,
// `nftables:` in nftables mode, `iptables:` in iptables mode and (for
// masqueradeAll and masqueradeBit) in ipvs mode, whose sync periods are in
// `ipvs:` (ipvsFields). The --iptables-* flags, as in kube-proxy, serve
// both nftables and iptables mode. localhostNodePorts exists in
// `iptables:` only.
func nftablesFields() []configField {
	type c = kubeProxyConfig
	return []configField{
		byMode(same("masquerade-all", func(o *options) *bool { return &o.masqueradeAll }, func(c *c) *bool { return &c.NFTables.MasqueradeAll }),
			same("masquerade-all", func(o *options) *bool { return &o.masqueradeAll }, func(c *c) *bool { return &c.IPTables.MasqueradeAll }), false),
		byMode(pointer("iptables-masquerade-bit", func(o *options) *int { return &o.masqueradeBit }, func(c *c) **int32 { return &c.NFTables.MasqueradeBit }),
			pointer("iptables-masquerade-bit", func(o *options) *int { return &o.masqueradeBit }, func(c *c) **int32 { return &c.IPTables.MasqueradeBit }), false),
		byMode(same("iptables-sync-period", func(o *options) *time.Duration { return &o.syncPeriod }, func(c *c) *time.Duration { return &c.NFTables.SyncPeriod.Duration }),
			same("iptables-sync-period", func(o *options) *time.Duration { return &o.syncPeriod }, func(c *c) *time.Duration { return &c.IPTables.SyncPeriod.Duration }), true),
		byMode(same("iptables-min-sync-period", func(o *options) *time.Duration { return &o.minSyncPeriod }, func(c *c) *time.Duration { return &c.NFTables.MinSyncPeriod.Duration }),
			same("iptables-min-sync-period", func(o *options) *time.Duration { return &o.minSyncPeriod }, func(c *c) *time.Duration { return &c.IPTables.MinSyncPeriod.Duration }), true),
		localhostNodePortsField(),
	}
}

// byMode is the nftables field in nftables mode, else the iptables one: the
// mode is known when these load (generalFields load first). A sync period
// (period) is neither read nor written in ipvs mode, which has its own.
// The other section's masqueradeBit is written with kube-proxy's default,
// as kube-proxy writes a section it did not read.
func byMode(nftables, iptables configField, period bool) configField {
	pick := func(o *options) (use, other configField, skip bool) {
		switch o.modeName() {
		case modeNFTables:
			return nftables, iptables, false
		case modeIPVS:
			return iptables, nftables, period
		}
		return iptables, nftables, false
	}
	return configField{
		flag: nftables.flag,
		load: func(c *kubeProxyConfig, o *options) {
			if use, _, skip := pick(o); !skip {
				use.load(c, o)
			}
		},
		store: func(o *options, c *kubeProxyConfig) {
			use, other, skip := pick(o)
			if skip {
				return
			}
			use.store(o, c)
			if !period && nftables.flag == "iptables-masquerade-bit" {
				d := o.masqueradeBit
				o.masqueradeBit = defaultMasqueradeBit
				other.store(o, c)
				o.masqueradeBit = d
			}
		},
	}
}

// featureGatesField is featureGates: the file's gates are kept apart (with
// --config, --feature-gates is ignored, so they are the effective ones,
// complete); the effective ones are written.
func featureGatesField() configField {
	return configField{
		flag: "feature-gates",
		load: func(c *kubeProxyConfig, o *options) { o.fileGates = c.FeatureGates },
		store: func(o *options, c *kubeProxyConfig) {
			if len(o.gates) > 0 {
				c.FeatureGates = o.gates
			}
		},
	}
}

// localhostNodePortsField is iptables.localhostNodePorts: read in any mode
// (so that setting it outside iptables mode can be warned about), written
// in every mode, as kube-proxy writes it.
func localhostNodePortsField() configField {
	return configField{
		flag: flagLocalhostNodePorts,
		load: func(c *kubeProxyConfig, o *options) {
			if p := c.IPTables.LocalhostNodePorts; p != nil {
				o.localhostNodePorts, o.localhostNodePortsSet = *p, true
			}
		},
		// Written in every mode, as kube-proxy writes it.
		store: func(o *options, c *kubeProxyConfig) {
			v := o.localhostNodePorts
			c.IPTables.LocalhostNodePorts = &v
		},
	}
}

// ipvsFields are the ipvs section's settings (the --ipvs-* flags).
func ipvsFields() []configField {
	type c = kubeProxyConfig
	return []configField{
		ipvsPeriod(same("ipvs-sync-period", func(o *options) *time.Duration { return &o.ipvs.syncPeriod }, func(c *c) *time.Duration { return &c.IPVS.SyncPeriod.Duration })),
		ipvsPeriod(same("ipvs-min-sync-period", func(o *options) *time.Duration { return &o.ipvs.minSyncPeriod }, func(c *c) *time.Duration { return &c.IPVS.MinSyncPeriod.Duration })),
		same("ipvs-scheduler", func(o *options) *string { return &o.ipvs.scheduler }, func(c *c) *string { return &c.IPVS.Scheduler }),
		list("ipvs-exclude-cidrs", func(o *options) *[]string { return &o.ipvs.excludeCIDRs }, func(c *c) *[]string { return &c.IPVS.ExcludeCIDRs }),
		same("ipvs-strict-arp", func(o *options) *bool { return &o.ipvs.strictARP }, func(c *c) *bool { return &c.IPVS.StrictARP }),
		same("ipvs-tcp-timeout", func(o *options) *time.Duration { return &o.ipvs.tcpTimeout }, func(c *c) *time.Duration { return &c.IPVS.TCPTimeout.Duration }),
		same("ipvs-tcpfin-timeout", func(o *options) *time.Duration { return &o.ipvs.tcpFinTimeout }, func(c *c) *time.Duration { return &c.IPVS.TCPFinTimeout.Duration }),
		same("ipvs-udp-timeout", func(o *options) *time.Duration { return &o.ipvs.udpTimeout }, func(c *c) *time.Duration { return &c.IPVS.UDPTimeout.Duration }),
	}
}

// ipvsPeriod is an ipvs sync period: read in any mode (and checked where
// it applies), written in ipvs mode only, as kube-proxy writes the sync
// periods of the mode in use.
func ipvsPeriod(f configField) configField {
	store := f.store
	f.store = func(o *options, c *kubeProxyConfig) {
		if o.modeName() == modeIPVS {
			store(o, c)
		}
	}
	return f
}

// conntrackFields are the conntrack section's settings (the --conntrack-*
// flags). As upstream: a nil pointer keeps the default, a zero value
// leaves the kernel's setting alone.
func conntrackFields() []configField {
	type c = kubeProxyConfig
	return []configField{
		pointer("conntrack-max-per-core", func(o *options) *int32 { return &o.ctTuning.MaxPerCore }, func(c *c) **int32 { return &c.Conntrack.MaxPerCore }),
		pointer("conntrack-min", func(o *options) *int32 { return &o.ctTuning.Min }, func(c *c) **int32 { return &c.Conntrack.Min }),
		durationPointer("conntrack-tcp-timeout-established", func(o *options) *time.Duration { return &o.ctTuning.TCPEstablishedTimeout },
			func(c *c) **metav1.Duration { return &c.Conntrack.TCPEstablishedTimeout }),
		durationPointer("conntrack-tcp-timeout-close-wait", func(o *options) *time.Duration { return &o.ctTuning.TCPCloseWaitTimeout },
			func(c *c) **metav1.Duration { return &c.Conntrack.TCPCloseWaitTimeout }),
		same("conntrack-tcp-be-liberal", func(o *options) *bool { return &o.tcpBeLiberal }, func(c *c) *bool { return &c.Conntrack.TCPBeLiberal }),
		same("conntrack-udp-timeout", func(o *options) *time.Duration { return &o.ctTuning.UDPTimeout }, func(c *c) *time.Duration { return &c.Conntrack.UDPTimeout.Duration }),
		same("conntrack-udp-timeout-stream", func(o *options) *time.Duration { return &o.ctTuning.UDPStreamTimeout },
			func(c *c) *time.Duration { return &c.Conntrack.UDPStreamTimeout.Duration }),
	}
}

// field binds an option to a config field through conversions; a zero
// field is not set.
func field[O any, C comparable](flag string, opt func(*options) *O, cfg func(*kubeProxyConfig) *C, toOpt func(C) O, toCfg func(O) C) configField {
	return configField{
		flag: flag,
		load: func(c *kubeProxyConfig, o *options) {
			var zero C
			if v := *cfg(c); v != zero {
				*opt(o) = toOpt(v)
			}
		},
		store: func(o *options, c *kubeProxyConfig) { *cfg(c) = toCfg(*opt(o)) },
	}
}

// same binds an option to a config field of its type.
func same[T comparable](flag string, opt func(*options) *T, cfg func(*kubeProxyConfig) *T) configField {
	identity := func(v T) T { return v }
	return field(flag, opt, cfg, identity, identity)
}

// text binds a string option to a string-based field (a mode).
func text[O, C ~string](flag string, opt func(*options) *O, cfg func(*kubeProxyConfig) *C) configField {
	return field(flag, opt, cfg, func(v C) O { return O(v) }, func(v O) C { return C(v) })
}

// integer binds an integer option to an integer field of another size.
func integer[O, C ~int | ~int32](flag string, opt func(*options) *O, cfg func(*kubeProxyConfig) *C) configField {
	return field(flag, opt, cfg, func(v C) O { return O(v) }, func(v O) C { return C(v) })
}

// pointer binds an integer option to a pointer field: nil is not set, and
// the effective value is always written.
func pointer[O, C ~int | ~int32](flag string, opt func(*options) *O, cfg func(*kubeProxyConfig) **C) configField {
	return configField{
		flag: flag,
		load: func(c *kubeProxyConfig, o *options) {
			if p := *cfg(c); p != nil {
				*opt(o) = O(*p)
			}
		},
		store: func(o *options, c *kubeProxyConfig) { v := C(*opt(o)); *cfg(c) = &v },
	}
}

// durationPointer is pointer for a *metav1.Duration field.
func durationPointer(flag string, opt func(*options) *time.Duration, cfg func(*kubeProxyConfig) **metav1.Duration) configField {
	return configField{
		flag: flag,
		load: func(c *kubeProxyConfig, o *options) {
			if p := *cfg(c); p != nil {
				*opt(o) = p.Duration
			}
		},
		store: func(o *options, c *kubeProxyConfig) { *cfg(c) = &metav1.Duration{Duration: *opt(o)} },
	}
}

// list binds a list option to a list field; an empty list is not set.
func list(flag string, opt func(*options) *[]string, cfg func(*kubeProxyConfig) *[]string) configField {
	return configField{
		flag: flag,
		load: func(c *kubeProxyConfig, o *options) {
			if v := *cfg(c); len(v) > 0 {
				*opt(o) = v
			}
		},
		store: func(o *options, c *kubeProxyConfig) { *cfg(c) = *opt(o) },
	}
}
