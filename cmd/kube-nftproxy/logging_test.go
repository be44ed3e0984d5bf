package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/internal/loglevel"
)

// resetLogging undoes startLogging (process-wide, as in kube-proxy), so
// that the next test can start it again; klog writes to stderr meanwhile.
func resetLogging(t testing.TB) {
	t.Helper()
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
}

// startTestLogging starts logging as the command's flags args ask for,
// writing to the buffers returned; flush writes out what is buffered.
func startTestLogging(t *testing.T, args ...string) (log *slog.Logger, flush func(), stdout, stderr *bytes.Buffer, err error) {
	t.Helper()
	o := &options{}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addLoggingFlags(fs)
	fs.StringVar(&o.featureGates, "feature-gates", "", "")
	if err := fs.Parse(args); err != nil {
		return nil, nil, nil, nil, err
	}
	gates, err := parseFeatureGates(o.featureGates)
	if err != nil {
		t.Fatal(err)
	}
	resetLogging(t)
	t.Cleanup(func() { resetLogging(t) })
	stdout, stderr = &bytes.Buffer{}, &bytes.Buffer{}
	log, flush, err = startLogging(&o.logging, gates, stdout, stderr)
	return log, flush, stdout, stderr, err
}

// logAt logs msg at level with one attribute and returns the line of the
// call, which the log line must name as its caller.
func logAt(log *slog.Logger, level slog.Level, msg string) int {
	_, _, line, _ := runtime.Caller(0)
	log.Log(context.Background(), level, msg, "k", "v", "n", 3)
	return line + 1
}

// klogTextLine is klog's text header and message: severity, date, time,
// thread, file:line, then the quoted message and its key/value pairs
// (structured logging), or a message as printf made it (klog.Warningf).
var klogTextLine = regexp.MustCompile(`^([IWE])\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ (\w+\.go):(\d+)\] (?:"([^"]*)"(.*)|([^"].*))$`)

// logLine is one parsed log line, of either format.
type logLine struct {
	severity string // I, W or E (JSON: E for an error, else I)
	caller   string // file.go:line
	msg      string
	v        int    // JSON only: -1 when absent (errors)
	rest     string // text: what follows the message
}

// parseLogLines parses every line of out in format, failing the test on a
// line that is not in it.
func parseLogLines(t *testing.T, format, out string) []logLine {
	t.Helper()
	var lines []logLine
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		if format == "json" {
			lines = append(lines, parseJSONLine(t, l))
			continue
		}
		m := klogTextLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a klog text line: %q", l)
		}
		msg := m[4]
		if m[6] != "" {
			msg = m[6]
		}
		lines = append(lines, logLine{severity: m[1], caller: m[2] + ":" + m[3], msg: msg, v: -1, rest: m[5]})
	}
	return lines
}

// parseJSONLine parses a line of component-base's JSON format: ts, caller
// (dir/file.go:line), msg, and v except for errors (which have err).
func parseJSONLine(t *testing.T, l string) logLine {
	t.Helper()
	var rec map[string]any
	if err := json.Unmarshal([]byte(l), &rec); err != nil {
		t.Fatalf("not a JSON line: %q: %v", l, err)
	}
	ts, okTS := rec["ts"].(float64)
	caller, okCaller := rec["caller"].(string)
	msg, okMsg := rec["msg"].(string)
	if !okTS || ts <= 0 || !okCaller || !okMsg {
		t.Fatalf("JSON line without ts, caller or msg: %q", l)
	}
	line := logLine{severity: "I", caller: caller[strings.LastIndex(caller, "/")+1:], msg: msg, v: -1}
	if v, ok := rec["v"].(float64); ok {
		line.v = int(v)
	} else {
		line.severity = "E"
	}
	return line
}

// Our packages' messages come out as kube-proxy's: klog's text header or
// component-base's JSON, naming the line that logged (not the bridge),
// with slog's levels as klog's severities and V levels.
func TestLogLines(t *testing.T) {
	levels := []struct {
		name     string
		level    slog.Level
		severity string // text
		v        int    // JSON; -1: an error, without v
	}{
		{"error", slog.LevelError, "E", -1},
		{"warning", slog.LevelWarn, "W", 0},
		{"info", slog.LevelInfo, "I", 0},
		{"v2", loglevel.V2, "I", 2},
		{"v4", loglevel.V4, "I", 4},
	}
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			log, _, stdout, stderr, err := startTestLogging(t, "--logging-format="+format, "-v=4")
			if err != nil {
				t.Fatal(err)
			}
			var want []int
			for _, l := range levels {
				want = append(want, logAt(log, l.level, l.name))
			}
			if stdout.Len() > 0 {
				t.Errorf("logs on stdout: %q", stdout)
			}
			got := parseLogLines(t, format, stderr.String())
			if len(got) != len(levels) {
				t.Fatalf("%d lines, want %d:\n%s", len(got), len(levels), stderr)
			}
			for i, l := range levels {
				g := got[i]
				if g.msg != l.name || g.caller != "logging_test.go:"+strconv.Itoa(want[i]) {
					t.Errorf("line %d: message %q from %s, want %q from logging_test.go:%d", i, g.msg, g.caller, l.name, want[i])
				}
				if format == "text" && (g.severity != l.severity || g.rest != ` k="v" n=3`) {
					t.Errorf("%s: severity %s, pairs %q; want %s, ` k=\"v\" n=3`", l.name, g.severity, g.rest, l.severity)
				}
				if format == "json" && g.v != l.v {
					t.Errorf("%s: v %d, want %d", l.name, g.v, l.v)
				}
			}
		})
	}
}

// -v filters as klog's: V(n) messages need -v n or more; warnings and
// errors always print; --vmodule raises the level of the files it names
// (in text format; component-base refuses it with JSON).
func TestVerbosity(t *testing.T) {
	all := []slog.Level{slog.LevelError, slog.LevelWarn, slog.LevelInfo, loglevel.V2, slog.Level(-3), loglevel.V4, slog.Level(-5)}
	tests := []struct {
		args    []string
		want    []string // messages logged
		wantErr string
	}{
		{args: nil, want: []string{"ERROR", "WARN", "INFO"}},
		{args: []string{"-v=1"}, want: []string{"ERROR", "WARN", "INFO"}},
		{args: []string{"-v=2"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2"}},
		{args: []string{"--v=3"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2", "DEBUG+1"}},
		{args: []string{"-v", "4"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2", "DEBUG+1", "DEBUG"}},
		{args: []string{"-v=4", "--logging-format=json"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2", "DEBUG+1", "DEBUG"}},
		{args: []string{"-v=9"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2", "DEBUG+1", "DEBUG", "DEBUG-1"}},
		{args: []string{"--vmodule=logging_test=4"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2", "DEBUG+1", "DEBUG"}},
		{args: []string{"--vmodule=logging*=2"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2"}},
		// Another file's setting leaves this one's at -v.
		{args: []string{"-v=2", "--vmodule=commands=4,server=5"}, want: []string{"ERROR", "WARN", "INFO", "DEBUG+2"}},
		{args: []string{"--vmodule=logging_test=4", "--logging-format=json"}, wantErr: "logging.vmodule: Forbidden: Only supported for text log format"},
		{args: []string{"--vmodule=logging_test"}, wantErr: `invalid argument "logging_test" for "--vmodule"`},
		{args: []string{"-v=-1"}, wantErr: `invalid argument "-1" for "-v, --v"`},
		{args: []string{"--log-flush-frequency=0s"}, wantErr: "logging.flushFrequency: Invalid value: \"0s\": Must be greater than zero"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			log, _, _, stderr, err := startTestLogging(t, tt.args...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range all {
				logAt(log, l, l.String())
			}
			format := "text"
			if slices.Contains(tt.args, "--logging-format=json") {
				format = "json"
			}
			var got []string
			for _, l := range parseLogLines(t, format, stderr.String()) {
				got = append(got, l.msg)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("logged %v, want %v", got, tt.want)
			}
		})
	}
}

// The alpha split streams and buffers, as component-base implements them:
// refused without LoggingAlphaOptions; text sends errors and warnings to
// stderr and info to stdout, JSON only errors to stderr; a buffer holds
// stdout's lines until flushed; each format reads only its own flags.
func TestLogStreams(t *testing.T) {
	alpha := "--feature-gates=LoggingAlphaOptions=true"
	tests := []struct {
		name           string
		args           []string
		wantErr        string
		stdout, stderr string // the messages in each, in order
		buffered       bool   // stdout is empty until flushed
	}{
		{name: "default", stderr: "error warning info"},
		{name: "text split without the gate", args: []string{"--log-text-split-stream"}, wantErr: "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		{name: "json split without the gate", args: []string{"--log-json-split-stream"}, wantErr: "logging.options.json.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		{name: "text buffer without the gate", args: []string{"--log-text-info-buffer-size=1Ki"}, wantErr: "logging.options.text.infoBufferSize: Forbidden"},
		{name: "json buffer without the gate", args: []string{"--log-json-info-buffer-size=4k"}, wantErr: "logging.options.json.infoBufferSize: Forbidden"},
		{name: "json buffer unparsable", args: []string{"--log-json-info-buffer-size=lots"}, wantErr: "log-json-info-buffer-size"},
		{name: "zero buffer without the gate", args: []string{"--log-text-info-buffer-size=0"}, stderr: "error warning info"},
		{name: "json without LoggingBetaOptions", args: []string{"--logging-format=json", "--feature-gates=LoggingBetaOptions=false"}, wantErr: "logging.format: Forbidden: Log format json is disabled, see LoggingBetaOptions feature"},
		{name: "unknown format", args: []string{"--logging-format=yaml"}, wantErr: `logging.format: Invalid value: "yaml": Unsupported log format`},
		{name: "text split", args: []string{"--log-text-split-stream", alpha}, stdout: "info", stderr: "error warning"},
		{name: "text split, buffered", args: []string{"--log-text-split-stream", "--log-text-info-buffer-size=1Mi", alpha}, stdout: "info", stderr: "error warning", buffered: true},
		{name: "json split", args: []string{"--logging-format=json", "--log-json-split-stream", alpha}, stdout: "warning info", stderr: "error"},
		{name: "json split, buffered", args: []string{"--logging-format=json", "--log-json-split-stream", "--log-json-info-buffer-size=64Ki", alpha}, stdout: "warning info", stderr: "error", buffered: true},
		{name: "text flags in json format", args: []string{"--logging-format=json", "--log-text-split-stream", alpha}, stderr: "error warning info"},
		{name: "json flags in text format", args: []string{"--log-json-split-stream", "--log-json-info-buffer-size=1M", alpha}, stderr: "error warning info"},
		{name: "buffer without split", args: []string{"--log-text-info-buffer-size=1M", alpha}, stderr: "error warning info"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log, flush, stdout, stderr, err := startTestLogging(t, tt.args...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []slog.Level{slog.LevelError, slog.LevelWarn, slog.LevelInfo} {
				logAt(log, l, map[slog.Level]string{slog.LevelError: "error", slog.LevelWarn: "warning", slog.LevelInfo: "info"}[l])
			}
			if tt.buffered && stdout.Len() > 0 {
				t.Errorf("stdout written before the flush: %q", stdout)
			}
			flush()
			format := "text"
			if slices.Contains(tt.args, "--logging-format=json") {
				format = "json"
			}
			for _, s := range []struct {
				name      string
				out, want string
			}{{"stdout", stdout.String(), tt.stdout}, {"stderr", stderr.String(), tt.stderr}} {
				var got []string
				for _, l := range parseLogLines(t, format, s.out) {
					got = append(got, l.msg)
				}
				if strings.Join(got, " ") != s.want {
					t.Errorf("%s has %q, want %q:\n%s", s.name, got, s.want, s.out)
				}
			}
		})
	}
}

// client-go logs through klog (klog.InfoS, klog.V(n), klog.Warningf,
// klog.ErrorS, utilruntime.HandleError): those lines come out in the
// chosen format too, each line parsing as it, mixed with ours.
func TestKlogLinesInFormat(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			log, _, _, stderr, err := startTestLogging(t, "--logging-format="+format, "-v=2")
			if err != nil {
				t.Fatal(err)
			}
			log.Info("ours")
			klog.InfoS("structured", "resource", "services")
			klog.V(2).InfoS("at v2")
			klog.V(3).InfoS("at v3, filtered")
			klog.Warningf("%s: watch of %s ended with: %s", "reflector", "*v1.Service", "very short watch")
			klog.ErrorS(errors.New("connection refused"), "Failed to watch")
			klog.Background().WithName("client").Info("contextual")
			klog.Flush()
			var got []string
			for _, l := range parseLogLines(t, format, stderr.String()) {
				if !strings.HasPrefix(l.caller, "logging_test.go:") {
					t.Errorf("%q: caller %s, want this file", l.msg, l.caller)
				}
				got = append(got, l.severity+" "+l.msg)
			}
			want := []string{"I ours", "I structured", "I at v2", "W reflector: watch of *v1.Service ended with: very short watch", "E Failed to watch", "I contextual"}
			if format == "json" {
				want[3] = "I" + want[3][1:] // JSON has no warning severity: v 0
			}
			if !slices.Equal(got, want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// --config's `logging:` block as kube-proxy takes it: every setting of it
// (vmodule and flushFrequency too) applies, each logging flag given wins,
// and --write-config-to writes the effective block. The feature gates are
// the file's: --feature-gates is ignored with --config, as in kube-proxy.
func TestLoggingConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	out := filepath.Join(dir, "effective.yaml")
	write := func(gates, logging string) {
		t.Helper()
		body := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + gates + "logging:\n" + logging
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	effective := func(args ...string) (string, error) {
		t.Helper()
		if _, err := run(append([]string{"--config", cfg, "--write-config-to", out}, args...)...); err != nil {
			return "", err
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var c proxyconfig.KubeProxyConfiguration
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatal(err)
		}
		l := c.Logging
		return fmt.Sprintf("format=%s v=%d vmodule=%v flush=%s text=%t/%s json=%t/%s", l.Format, l.Verbosity, l.VModule, l.FlushFrequency.Duration.Duration,
			l.Options.Text.SplitStream, l.Options.Text.InfoBufferSize.String(), l.Options.JSON.SplitStream, l.Options.JSON.InfoBufferSize.String()), nil
	}
	const gated = "featureGates: {LoggingAlphaOptions: true}\n"
	const block = "  verbosity: 3\n  vmodule: [{filePattern: server, verbosity: 5}]\n  flushFrequency: 1s\n  options:\n    text: {splitStream: true, infoBufferSize: 2Ki}\n"
	tests := []struct {
		gates         string
		args          []string
		want, wantErr string
	}{
		{gates: gated, want: "format=text v=3 vmodule=[{server 5}] flush=1s text=true/2Ki json=false/0"},
		{gates: gated, args: []string{"-v=5", "--vmodule=loop=4,healthcheck=2", "--log-flush-frequency=3s", "--log-text-info-buffer-size=0"},
			want: "format=text v=5 vmodule=[{loop 4} {healthcheck 2}] flush=3s text=true/0 json=false/0"},
		{args: nil, wantErr: "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		// The flag's gate does not count with --config.
		{args: []string{"--feature-gates=LoggingAlphaOptions=true"}, wantErr: "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		{gates: gated, args: []string{"--logging-format=json"}, wantErr: "logging.vmodule: Forbidden: Only supported for text log format"},
	}
	for _, tt := range tests {
		write(tt.gates, block)
		got, err := effective(tt.args...)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: err %v, want %q", tt.args, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%v: %s, %v; want %s", tt.args, got, err, tt.want)
		}
	}
	// An empty block is component-base's defaults.
	write("", "  {}\n")
	if got, err := effective(); err != nil || got != "format=text v=0 vmodule=[] flush=5s text=false/0 json=false/0" {
		t.Errorf("empty logging block: %s, %v", got, err)
	}
}

// TestBufferedLogging: the flush daemon is kept only where an output holds
// messages back (a split stream's info buffer) or the format is unknown.
func TestBufferedLogging(t *testing.T) {
	withBuffer := func(c *logsapi.LoggingConfiguration, json bool) {
		if json {
			c.Options.JSON.SplitStream = true
			_ = c.Options.JSON.InfoBufferSize.Set("64Ki")
			return
		}
		c.Options.Text.SplitStream = true
		_ = c.Options.Text.InfoBufferSize.Set("64Ki")
	}
	for _, tc := range []struct {
		name  string
		setup func(*logsapi.LoggingConfiguration)
		want  bool
	}{
		{"text default", func(*logsapi.LoggingConfiguration) {}, false},
		{"text split stream, no buffer", func(c *logsapi.LoggingConfiguration) { c.Options.Text.SplitStream = true }, false},
		{"text split stream with buffer", func(c *logsapi.LoggingConfiguration) { withBuffer(c, false) }, true},
		{"json default", func(c *logsapi.LoggingConfiguration) { c.Format = logsapi.JSONLogFormat }, false},
		{"json split stream with buffer", func(c *logsapi.LoggingConfiguration) {
			c.Format = logsapi.JSONLogFormat
			withBuffer(c, true)
		}, true},
		{"unknown format", func(c *logsapi.LoggingConfiguration) { c.Format = "other" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := logsapi.NewLoggingConfiguration()
			tc.setup(c)
			if got := buffered(c); got != tc.want {
				t.Errorf("buffered = %v, want %v", got, tc.want)
			}
		})
	}
}
