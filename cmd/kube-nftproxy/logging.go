package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// logStreams are kube-proxy's alpha logging flags (component-base's
// --log-{text,json}-split-stream and --log-{text,json}-info-buffer-size),
// with their documented effect: split, messages of level ERROR go to stderr
// and the others to stdout (instead of everything to stderr); with a
// buffer size as well, those on stdout are buffered up to that many bytes
// and flushed every logFlushPeriod and when the command ends. As in
// kube-proxy, each format reads only its own pair, the buffer only applies
// to a split stream, and setting any of them needs the LoggingAlphaOptions
// feature gate.
type logStreams struct {
	textSplit, jsonSplit   bool
	textBuffer, jsonBuffer resource.QuantityValue
}

// logFlushPeriod is kube-proxy's default --log-flush-frequency, which it
// uses to flush buffered info messages.
const logFlushPeriod = 5 * time.Second

func (l *logStreams) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&l.textSplit, "log-text-split-stream", false, "[Alpha] in text format, write error messages to stderr and the others to stdout (default: everything to stderr); needs --feature-gates=LoggingAlphaOptions=true")
	fs.Var(&l.textBuffer, "log-text-info-buffer-size", "[Alpha] in text format with split streams, buffer up to this many bytes of messages for stdout (512, 1K, 2Ki, 3M, ...; 0: no buffering); needs --feature-gates=LoggingAlphaOptions=true")
	fs.BoolVar(&l.jsonSplit, "log-json-split-stream", false, "[Alpha] in JSON format, write error messages to stderr and the others to stdout (default: everything to stderr); needs --feature-gates=LoggingAlphaOptions=true")
	fs.Var(&l.jsonBuffer, "log-json-info-buffer-size", "[Alpha] in JSON format with split streams, buffer up to this many bytes of messages for stdout (512, 1K, 2Ki, 3M, ...; 0: no buffering); needs --feature-gates=LoggingAlphaOptions=true")
}

// forFormat returns the split and buffer settings of one --logging-format.
func (l *logStreams) forFormat(format string) (split bool, buffer int64) {
	if format == "json" {
		return l.jsonSplit, l.jsonBuffer.Value()
	}
	return l.textSplit, l.textBuffer.Value()
}

// checkGates refuses what kube-proxy refuses: an alpha logging option
// without the LoggingAlphaOptions gate (whatever the format), and the JSON
// format with LoggingBetaOptions turned off.
func (l *logStreams) checkGates(format string, gates map[string]bool) error {
	for _, o := range []struct {
		flag string
		set  bool
	}{
		{"log-text-split-stream", l.textSplit},
		{"log-text-info-buffer-size", l.textBuffer.Value() != 0},
		{"log-json-split-stream", l.jsonSplit},
		{"log-json-info-buffer-size", l.jsonBuffer.Value() != 0},
	} {
		if o.set && !gates["LoggingAlphaOptions"] {
			return fmt.Errorf("--%s: feature gate LoggingAlphaOptions is disabled (enable it with --feature-gates=LoggingAlphaOptions=true)", o.flag)
		}
	}
	for _, o := range []struct {
		flag string
		size int64
	}{{"log-text-info-buffer-size", l.textBuffer.Value()}, {"log-json-info-buffer-size", l.jsonBuffer.Value()}} {
		if o.size < 0 {
			return fmt.Errorf("--%s %d: must not be negative", o.flag, o.size)
		}
	}
	if enabled, set := gates["LoggingBetaOptions"]; format == "json" && set && !enabled {
		return fmt.Errorf("--logging-format json: feature gate LoggingBetaOptions is disabled")
	}
	return nil
}

// newLogger returns the logger the logging flags ask for. With a single
// stream everything goes to stderr; see logStreams for the split one.
// flush writes out what is buffered; call it once, before exiting. The
// buffer is also flushed every logFlushPeriod until then (or until ctx ends).
func (o *options) newLogger(ctx context.Context, gates map[string]bool, stdout, stderr io.Writer) (log *slog.Logger, flush func(), err error) {
	if err := o.logStreams.checkGates(o.logFormat, gates); err != nil {
		return nil, nil, err
	}
	split, size := o.logStreams.forFormat(o.logFormat)
	if !split {
		log, err := o.logger(stderr)
		return log, func() {}, err
	}
	flush = func() {}
	if size > 0 {
		b := newBufferedWriter(stdout, int(min(size, 1<<30)))
		stop := make(chan struct{})
		var once sync.Once
		stdout, flush = b, func() {
			once.Do(func() { close(stop) })
			b.flush()
		}
		go func() {
			t := time.NewTicker(logFlushPeriod)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-stop:
					return
				case <-t.C:
					b.flush()
				}
			}
		}()
	}
	info, err := o.logger(stdout)
	if err != nil {
		return nil, nil, err
	}
	errs, err := o.logger(stderr)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(&splitHandler{info: info.Handler(), errs: errs.Handler()}), flush, nil
}

// splitHandler sends records of level ERROR and above to errs, the others
// to info (two handlers with the same options, on two streams).
type splitHandler struct{ info, errs slog.Handler }

func (h *splitHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.info.Enabled(ctx, l)
}

func (h *splitHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		return h.errs.Handle(ctx, r)
	}
	return h.info.Handle(ctx, r)
}

func (h *splitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &splitHandler{info: h.info.WithAttrs(as), errs: h.errs.WithAttrs(as)}
}

func (h *splitHandler) WithGroup(name string) slog.Handler {
	return &splitHandler{info: h.info.WithGroup(name), errs: h.errs.WithGroup(name)}
}

// bufferedWriter is a bufio.Writer safe for the logger and the flusher.
type bufferedWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func newBufferedWriter(w io.Writer, size int) *bufferedWriter {
	return &bufferedWriter{w: bufio.NewWriterSize(w, size)}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w.Write(p)
}

func (b *bufferedWriter) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.w.Flush()
}

// checkLoggingConfig refuses the logging settings of a
// KubeProxyConfiguration (component-base's LoggingConfiguration) that have
// no flag here: vmodule and a flush frequency other than the default, as
// --vmodule and --log-flush-frequency are. The others are configFields.
func checkLoggingConfig(c *proxyconfig.KubeProxyConfiguration) error {
	lc := c.Logging
	if len(lc.VModule) > 0 {
		return errors.New("logging.vmodule is not supported by kube-nftproxy (yet), as --vmodule")
	}
	if d := lc.FlushFrequency.Duration.Duration; d != 0 && d != logFlushPeriod {
		return fmt.Errorf("logging.flushFrequency %s: kube-nftproxy supports only the default, %s (--log-flush-frequency is not supported either)", d, logFlushPeriod)
	}
	return nil
}
