package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The config file decodes as kube-proxy's strict decoder does: field names
// are case-sensitive, and unknown or duplicate fields are errors naming
// them, in kube-proxy's words.
func TestConfigStrictDecoding(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	tests := []struct {
		name, body, want string
	}{
		{"case of a field", "clusterCidr: 10.244.0.0/16\n", `strict decoding error: unknown field "clusterCidr"`},
		{"case of a nested field", "nftables:\n  masqueradeall: true\n", `strict decoding error: unknown field "nftables.masqueradeall"`},
		{"every unknown field", "clusterCidr: 10.244.0.0/16\nhostnameoverride: x\n", `unknown field "clusterCidr", unknown field "hostnameoverride"`},
		{"duplicate field", "clusterCIDR: 10.244.0.0/16\nclusterCIDR: 10.245.0.0/16\n", `key "clusterCIDR" already set in map`},
		{"wrong type", "clusterCIDR: [a]\n", "clusterCIDR"},
		{"oomScoreAdj out of range", "oomScoreAdj: 1001\n", "oomScoreAdj 1001: must be within the range [-1000, 1000]"},
		{"good", "clusterCIDR: 10.244.0.0/16\noomScoreAdj: -500\n", ""},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(p, []byte(head+tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := run("--config", p, "--write-config-to", filepath.Join(dir, "out.yaml"))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err %v, want it to mention %q", err, tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), p):
				t.Errorf("err %v does not name the file", err)
			}
		})
	}
}

// oomScoreAdj in --config and --oom-score-adj are one setting, as in
// kube-proxy: default -999, the file's value (a flag given is then
// ignored, as kube-proxy ignores it); written back by --write-config-to.
func TestOOMScoreAdjConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: -500\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "oomScoreAdj: -999"},
		{[]string{"--oom-score-adj=100"}, "oomScoreAdj: 100"},
		{[]string{"--config", cfg}, "oomScoreAdj: -500"},
		{[]string{"--config", cfg, "--oom-score-adj", "-1000"}, "oomScoreAdj: -500"},
	} {
		out := filepath.Join(dir, "out.yaml")
		if _, err := run(append(tt.args, "--write-config-to", out)...); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		eff, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(eff), tt.want+"\n") {
			t.Errorf("%v: effective config lacks %q:\n%s", tt.args, tt.want, eff)
		}
	}
}

func TestApplyOOMScoreAdj(t *testing.T) {
	p := filepath.Join(t.TempDir(), "oom_score_adj")
	applyOOMScoreAdj(p, -999, slog.New(slog.DiscardHandler))
	if got, err := os.ReadFile(p); err != nil || string(got) != "-999" {
		t.Errorf("wrote %q, %v; want -999", got, err)
	}
}

// A --config that is no KubeProxyConfiguration by its size (/dev/zero, a
// disk image) is refused after maxConfigBytes, not read until memory runs
// out.
func TestConfigFileTooLarge(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("#\n"), maxConfigBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", big} {
		out, err := run("--config", path, "--write-config-to", os.DevNull)
		if err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
			t.Errorf("--config %s: %v (%s), want it refused for its size", path, err, out)
		}
	}
}
