package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	fieldpath "k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as kube-proxy registers it
	"k8s.io/klog/v2"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// Logging is kube-proxy's: component-base's logging configuration (the
// `logging:` block of --config, and the flags -v, --vmodule,
// --logging-format, --log-flush-frequency and the alpha
// --log-{text,json}-{split-stream,info-buffer-size}), applied with
// component-base's ValidateAndApply, which installs klog's text logger or
// the JSON (zap) logger as klog's one output. client-go logs through klog
// and so comes out in the same format; our packages log with *slog.Logger,
// bridged to that same output (klogSlog).

// addLoggingFlags adds kube-proxy's logging flags to fs, bound to
// o.logging (component-base's defaults: text, -v 0, flushes every 5s).
func (o *options) addLoggingFlags(fs *pflag.FlagSet) {
	o.logging = *logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(&o.logging, fs)
}

// loadLoggingConfig takes --config's `logging:` block as kube-proxy does:
// the block replaces the defaults as a whole (what it leaves out gets
// component-base's recommended value), then each logging flag given on the
// command line wins over the file.
func (o *options) loadLoggingConfig(c *proxyconfig.KubeProxyConfiguration, fs *pflag.FlagSet) error {
	l := c.Logging.DeepCopy()
	logsapi.SetRecommendedLoggingConfiguration(l)
	if err := overrideFromFlags(fs, l); err != nil {
		return err
	}
	o.logging = *l
	return nil
}

// overrideFromFlags sets in c the logging flags given in fs (a flag set
// holding the flags addLoggingFlags adds, parsed), leaving the others as
// c has them. A --vmodule given replaces c's list, as in kube-proxy.
func overrideFromFlags(fs *pflag.FlagSet, c *logsapi.LoggingConfiguration) error {
	bound := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	// Binding a flag sets the field to the flag's default (the split
	// streams to false): put c's values back under the bound flags.
	values := c.DeepCopy()
	logsapi.AddFlags(c, bound)
	values.DeepCopyInto(c)
	var errs []error
	bound.VisitAll(func(f *pflag.Flag) {
		given := fs.Lookup(f.Name)
		if given == nil || !given.Changed {
			return
		}
		if f.Name == "vmodule" {
			c.VModule = nil
		}
		if err := f.Value.Set(given.Value.String()); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
		}
	})
	return errors.Join(errs...)
}

// loggingGate is the feature gate component-base's logging reads, with the
// logging gates that --feature-gates sets (LoggingAlphaOptions for the
// split streams and buffers, LoggingBetaOptions for the JSON format) and
// every other one at its default. ContextualLogging is left at its default
// (on): with it off, klog would lose the attributes our loggers carry.
func loggingGate(gates map[string]bool) (featuregate.FeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, name := range []featuregate.Feature{logsapi.LoggingAlphaOptions, logsapi.LoggingBetaOptions} {
		if v, ok := gates[string(name)]; ok {
			set[string(name)] = v
		}
	}
	if err := fg.SetFromMap(set); err != nil {
		return nil, fmt.Errorf("--feature-gates: %w", err)
	}
	return fg, nil
}

// startLogging validates c as kube-proxy does and makes it klog's output:
// messages go to stderr, or with a split stream errors (text: errors and
// warnings) to stderr and the others to stdout. It returns our packages'
// logger and flush, which writes out what is buffered (call it before
// exiting). Logging is process-wide: it is started once per process.
func startLogging(c *logsapi.LoggingConfiguration, gates map[string]bool, stdout, stderr io.Writer) (*slog.Logger, func(), error) {
	fg, err := loggingGate(gates)
	if err != nil {
		return nil, nil, err
	}
	// Validated with the field path of --config's block, so that an error
	// names the setting (logging.format, logging.options.text.splitStream).
	if errs := logsapi.Validate(c, fg, fieldpath.NewPath("logging")); len(errs) > 0 {
		return nil, nil, errs.ToAggregate()
	}
	if err := logsapi.ValidateAndApplyWithOptions(c, &logsapi.LoggingOptions{ErrorStream: stderr, InfoStream: stdout}, fg); err != nil {
		return nil, nil, fmt.Errorf("starting logging: %w", err)
	}
	if !buffered(c) {
		// Nothing to flush: the daemon would only wake the process
		// every --log-flush-frequency (5 s) for nothing.
		klog.StopFlushDaemon()
	}
	return klogSlog(), klog.Flush, nil
}

// buffered reports whether c's output holds messages back until a flush:
// only a split stream's info buffer (--log-{text,json}-info-buffer-size)
// does; the text and JSON formats write everything else at once.
func buffered(c *logsapi.LoggingConfiguration) bool {
	switch c.Format {
	case logsapi.DefaultLogFormat, logsapi.JSONLogFormat:
		text, json := c.Options.Text, c.Options.JSON
		return (text.SplitStream && text.InfoBufferSize.Value() > 0) || (json.SplitStream && json.InfoBufferSize.Value() > 0)
	}
	return true // a format we do not know: flush as configured
}

// slogCallDepth is how many more frames a call through *slog.Logger has
// than one through logr.Logger between our code and the klog sink's
// Enabled (slog's Logger.Info, Logger.log, Logger.Enabled, and logr's
// slog handler, against logr's Logger.Info): --vmodule, which klog's text
// logger applies in Enabled by looking up its caller's file, then names
// our file. The file:line printed comes from the record's PC, not from
// this depth. TestVerbosity checks it.
const slogCallDepth = 3

// klogSlog is an *slog.Logger writing through klog's logger (as
// startLogging installs it): slog.Level(-n) is V(n), warnings and errors
// are klog's, and the caller printed is the line that called the logger.
func klogSlog() *slog.Logger {
	return slog.New(logr.ToSlogHandler(klog.Background().WithCallDepth(slogCallDepth)))
}

// startCommandLogging starts logging for a subcommand (render, diff,
// trace, version) from the root's logging flags; the settings only the
// proxy has (--config, --feature-gates) are the defaults here. The
// subcommands' results go to stdout; their logs, as the proxy's, to stderr.
func startCommandLogging(cmd *cobra.Command, _ []string) error {
	if cmd == cmd.Root() {
		return nil // runRoot starts logging once --config is read
	}
	c := logsapi.NewLoggingConfiguration()
	if err := overrideFromFlags(cmd.Flags(), c); err != nil {
		return err
	}
	_, _, err := startLogging(c, nil, cmd.OutOrStdout(), cmd.ErrOrStderr())
	return err
}
