package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/nft"
)

// render, diff and trace assume the rules the proxy would program: they take
// its rule flags, --proxy-mode, --config and --feature-gates, and complete
// them as the proxy does, so that an empty mode is iptables mode's behaviour
// there too, with that mode's NodePort addresses and localhost NodePorts.

// addRuleCommandFlags adds the flags render, diff and trace share with the
// proxy; modes names the modes the command takes.
func (o *options) addRuleCommandFlags(fs *pflag.FlagSet, modes string) {
	o.addRuleFlags(fs)
	fs.StringVar(&o.proxyMode, "proxy-mode", "", "the proxy mode to assume, as the proxy's --proxy-mode: empty (kube-proxy's default: iptables), "+modes)
	fs.StringVar(&o.configFile, "config", "", "the proxy's KubeProxyConfiguration file: its mode, rule settings and feature gates apply and, as in the proxy, the rule flags given beside it are ignored (with a warning) but --hostname-override")
	fs.StringVar(&o.featureGates, "feature-gates", "", "kube-proxy's feature gates (Name=true,...), as the proxy's; ignored with --config, whose featureGates apply")
}

// completeRuleCommand reads --config and completes the options as the proxy
// does. own are the command's flags that are not settings (--state,
// --iptables-save, --src, ...): --config leaves them alone.
func (o *options) completeRuleCommand(fs *pflag.FlagSet, own ...string) error {
	if o.configFile != "" {
		o.commandFlags = own
		if err := o.loadConfig(o.configFile, fs); err != nil {
			return err
		}
		o.noteIgnoredFlags(fs, klogSlog())
	}
	if err := o.completeHostname(fs); err != nil {
		return err
	}
	o.givenNodePortAddrs = slices.Clone(o.nodePortAddrs)
	if err := o.complete(); err != nil {
		return err
	}
	if err := checkMode(o.proxyMode); err != nil {
		return fmt.Errorf("--proxy-mode: %w", err)
	}
	return nil
}

// inMode is a copy of completed options with another proxy mode, defaulted
// as that mode defaults (the NodePort addresses given, not the ones the
// first mode filled in).
func (o *options) inMode(mode string) *options {
	alt := *o
	alt.proxyMode, alt.modeDefaulted = mode, false
	alt.nodePortAddrs = slices.Clone(o.givenNodePortAddrs)
	alt.nodePortAddrs = alt.effectiveNodePortAddrs()
	return &alt
}

// assumedMode says which mode a command assumed and what that means for
// the rules that differ between modes, e.g. "iptables (--proxy-mode not
// set: kube-proxy's default); NodePorts on every local address and
// 127.0.0.0/8".
func (o *options) assumedMode() string {
	mode := o.modeName()
	var how string
	switch {
	case o.modeDefaulted && o.configFile != "":
		how = "not set in --config: kube-proxy's default"
	case o.modeDefaulted:
		how = "--proxy-mode not set: kube-proxy's default"
	case o.configFile != "":
		how = "from --config"
	default:
		how = "--proxy-mode"
	}
	if mode == modeIPVS {
		return fmt.Sprintf("%s (%s)", mode, how)
	}
	return fmt.Sprintf("%s (%s); NodePorts on %s", mode, how, o.nodePortsServed())
}

// nodePortsServed says where the completed options serve NodePorts.
func (o *options) nodePortsServed() string {
	where := "every local address"
	if addrs := o.effectiveNodePortAddrs(); len(addrs) > 0 {
		var parts []string
		for _, a := range addrs {
			if a == nodePortPrimary {
				a = "the Node's primary addresses"
			}
			parts = append(parts, a)
		}
		where = strings.Join(parts, ", ")
	}
	if cfg, err := o.nftConfig(); err == nil && nft.LocalhostNodePorts(cfg) {
		where += " and 127.0.0.0/8"
	}
	return where
}
