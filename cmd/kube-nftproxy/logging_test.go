package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// kube-proxy's alpha logging flags: refused without LoggingAlphaOptions,
// naming the flag; with it, a split stream sends ERROR to stderr and the
// rest to stdout, and a buffer holds stdout's messages until flushed. Each
// format reads only its own flags.
func TestLogStreams(t *testing.T) {
	alpha := []string{"--feature-gates", "LoggingAlphaOptions=true"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
		// where messages go: the levels found in stdout and stderr
		stdout, stderr string
		buffered       bool // stdout is empty until flushed
	}{
		{name: "default", stderr: "ERROR WARN INFO"},
		{name: "text split without the gate", args: []string{"--log-text-split-stream"}, wantErr: "--log-text-split-stream: feature gate LoggingAlphaOptions is disabled"},
		{name: "json split without the gate", args: []string{"--log-json-split-stream"}, wantErr: "--log-json-split-stream: feature gate LoggingAlphaOptions is disabled"},
		{name: "text buffer without the gate", args: []string{"--log-text-info-buffer-size=1Ki"}, wantErr: "--log-text-info-buffer-size: feature gate LoggingAlphaOptions"},
		{name: "json buffer without the gate", args: []string{"--log-json-info-buffer-size=4k"}, wantErr: "--log-json-info-buffer-size: feature gate LoggingAlphaOptions"},
		{name: "json buffer unparsable", args: []string{"--log-json-info-buffer-size=lots"}, wantErr: "log-json-info-buffer-size"},
		{name: "negative buffer", args: append([]string{"--log-text-info-buffer-size=-1"}, alpha...), wantErr: "must not be negative"},
		{name: "zero buffer without the gate", args: []string{"--log-text-info-buffer-size=0"}, stderr: "ERROR WARN INFO"},
		{name: "json without LoggingBetaOptions", args: []string{"--logging-format=json", "--feature-gates", "LoggingBetaOptions=false"}, wantErr: "--logging-format json: feature gate LoggingBetaOptions is disabled"},
		{name: "text split", args: append([]string{"--log-text-split-stream"}, alpha...), stdout: "WARN INFO", stderr: "ERROR"},
		{name: "text split, buffered", args: append([]string{"--log-text-split-stream", "--log-text-info-buffer-size=1Mi"}, alpha...), stdout: "WARN INFO", stderr: "ERROR", buffered: true},
		{name: "json split", args: append([]string{"--logging-format=json", "--log-json-split-stream"}, alpha...), stdout: "WARN INFO", stderr: "ERROR"},
		{name: "text flags in json format", args: append([]string{"--logging-format=json", "--log-text-split-stream"}, alpha...), stderr: "ERROR WARN INFO"},
		{name: "json flags in text format", args: append([]string{"--log-json-split-stream", "--log-json-info-buffer-size=1M"}, alpha...), stderr: "ERROR WARN INFO"},
		{name: "buffer without split", args: append([]string{"--log-text-info-buffer-size=1M"}, alpha...), stderr: "ERROR WARN INFO"},
	}
	levels := func(out string) string {
		var got []string
		for _, l := range []string{"ERROR", "WARN", "INFO"} {
			if strings.Contains(out, "level="+l) || strings.Contains(out, `"level":"`+l+`"`) {
				got = append(got, l)
			}
		}
		return strings.Join(got, " ")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &options{}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			fs.StringVar(&o.logFormat, "logging-format", "text", "")
			fs.StringVar(&o.featureGates, "feature-gates", "", "")
			o.logStreams.addFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				if tt.wantErr == "" || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parsing %v: %v, want %q", tt.args, err, tt.wantErr)
				}
				return
			}
			gates, err := parseFeatureGates(o.featureGates)
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			log, flush, err := o.newLogger(context.Background(), gates, &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Error("e")
			log.Warn("w")
			log.Info("i")
			if tt.buffered && stdout.Len() > 0 {
				t.Errorf("stdout written before the flush: %q", stdout.String())
			}
			flush()
			if got := levels(stdout.String()); got != tt.stdout {
				t.Errorf("stdout has %q, want %q:\n%s", got, tt.stdout, stdout.String())
			}
			if got := levels(stderr.String()); got != tt.stderr {
				t.Errorf("stderr has %q, want %q:\n%s", got, tt.stderr, stderr.String())
			}
		})
	}
}

// The flags through the command, and the logging section of --config as
// the same flags (a flag given wins), written back by --write-config-to.
func TestLogStreamsCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "effective.yaml")
	if _, err := run("--log-text-split-stream", "--write-config-to", out); err == nil || !strings.Contains(err.Error(), "--log-text-split-stream: feature gate LoggingAlphaOptions is disabled") {
		t.Errorf("--log-text-split-stream without the gate: %v", err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	write := func(logging string) {
		t.Helper()
		body := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n" + logging
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("  format: json\n  verbosity: 3\n  options:\n    json:\n      splitStream: true\n      infoBufferSize: 2Ki\n")
	if _, err := run("--config", cfg, "--write-config-to", out); err == nil || !strings.Contains(err.Error(), "--log-json-split-stream: feature gate LoggingAlphaOptions is disabled") {
		t.Errorf("config with splitStream, without the gate: %v", err)
	}
	if _, err := run("--config", cfg, "--v=5", "--feature-gates", "LoggingAlphaOptions=true", "--write-config-to", out); err != nil {
		t.Fatal(err)
	}
	eff, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"format: json", "verbosity: 5", "splitStream: true", "infoBufferSize: 2Ki", "flushFrequency: 5s"} {
		if !strings.Contains(string(eff), want) {
			t.Errorf("effective config lacks %q:\n%s", want, eff)
		}
	}
	// What --write-config-to wrote loads again.
	if _, err := run("--config", out, "--feature-gates", "LoggingAlphaOptions=true", "--write-config-to", filepath.Join(dir, "again.yaml")); err != nil {
		t.Errorf("reloading the effective config: %v", err)
	}
	for body, want := range map[string]string{
		"  vmodule:\n  - {filePattern: foo, verbosity: 3}\n": "logging.vmodule is not supported",
		"  flushFrequency: 1s\n":                             "logging.flushFrequency 1s",
	} {
		write(body)
		if _, err := run("--config", cfg, "--write-config-to", out); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config logging %q: %v, want %q", body, err, want)
		}
	}
}
