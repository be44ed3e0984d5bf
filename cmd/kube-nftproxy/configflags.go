package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// ignoredFlag is a flag given on the command line that --config overrides.
type ignoredFlag struct {
	name, given string
}

// flagsKeptWithConfig are the flags that still apply with --config, as in
// kube-proxy v1.37 (whose Complete replaces its whole configuration with
// the file's): those that are not settings of a KubeProxyConfiguration
// (--config itself, --write-config-to, --cleanup, --init-only, --master,
// --version), --hostname-override (which wins over the file's) and the
// logging flags (copied over the file's logging block); ours: --state and
// the hidden testing-* flags.
func flagsKeptWithConfig() map[string]bool {
	keep := map[string]bool{
		"config": true, "write-config-to": true, "cleanup": true, "init-only": true, "master": true,
		"hostname-override": true, "version": true, "help": true, "state": true,
	}
	logging := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logsapi.AddFlags(logsapi.NewLoggingConfiguration(), logging)
	logging.VisitAll(func(f *pflag.Flag) { keep[f.Name] = true })
	return keep
}

// ignoreFlagsUnderConfig undoes, as kube-proxy ignores them when --config
// is given, the flags given on the command line that set a field of the
// file: each goes back to its default (and to not given), so that the
// file's value, or kube-proxy's default for the field, applies. They are
// kept in o.ignoredFlags, to be warned of once logging runs.
func (o *options) ignoreFlagsUnderConfig(fs *pflag.FlagSet) error {
	keep := flagsKeptWithConfig()
	var errs []error
	fs.Visit(func(f *pflag.Flag) {
		if keep[f.Name] || slices.Contains(o.commandFlags, f.Name) || strings.HasPrefix(f.Name, "testing-") {
			return
		}
		o.ignoredFlags = append(o.ignoredFlags, ignoredFlag{name: f.Name, given: f.Value.String()})
		if err := resetFlag(f); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

// resetFlag sets f back to its default value, as if it had not been given.
func resetFlag(f *pflag.Flag) error {
	var err error
	if s, ok := f.Value.(pflag.SliceValue); ok {
		var def []string
		if v := strings.Trim(f.DefValue, "[]"); v != "" {
			def = strings.Split(v, ",")
		}
		err = s.Replace(def)
	} else {
		err = f.Value.Set(f.DefValue)
	}
	if err != nil {
		return fmt.Errorf("--%s: resetting to its default %q under --config: %w", f.Name, f.DefValue, err)
	}
	f.Changed = false
	return nil
}

// noteIgnoredFlags warns of each flag --config overrode, naming the value
// given and the one used (the file's, or kube-proxy's default for it).
func (o *options) noteIgnoredFlags(fs *pflag.FlagSet, log *slog.Logger) {
	for _, f := range o.ignoredFlags {
		log.Warn("flag ignored: --config is given, as in kube-proxy; set it in the config file",
			"flag", "--"+f.name, "value", f.given, "config", o.effectiveFlagValue(fs, f.name))
	}
}

// effectiveFlagValue is the value in use for a flag's setting: the flag's
// own value (bound to the setting), but for --feature-gates, whose
// effective gates are the file's.
func (o *options) effectiveFlagValue(fs *pflag.FlagSet, name string) string {
	if name == "feature-gates" {
		var gates []string
		for _, k := range slices.Sorted(maps.Keys(o.gates)) {
			gates = append(gates, fmt.Sprintf("%s=%t", k, o.gates[k]))
		}
		return strings.Join(gates, ",")
	}
	if f := fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
