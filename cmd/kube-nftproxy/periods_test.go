package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Sync periods are validated as kube-proxy does, from flags and from
// --config, before anything runs and before --write-config-to writes a
// file: syncPeriod > 0, minSyncPeriod >= 0 and <= syncPeriod. A zero
// period in the file means the default, as kube-proxy's defaulting does.
func TestSyncPeriodValidation(t *testing.T) {
	dir := t.TempDir()
	config := func(body string) string {
		p := filepath.Join(dir, strings.NewReplacer(" ", "_", ":", "", "\n", "_").Replace(body)+".yaml")
		data := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + body
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		want string // "" for success
	}{
		{"both zero", []string{"--iptables-sync-period=0s", "--iptables-min-sync-period=0s"}, "--iptables-sync-period 0s: must be greater than 0"},
		{"sync zero", []string{"--iptables-sync-period=0"}, "--iptables-sync-period 0s: must be greater than 0"},
		{"sync negative", []string{"--iptables-sync-period=-1s"}, "--iptables-sync-period -1s: must be greater than 0"},
		{"min negative", []string{"--iptables-min-sync-period=-1s"}, "--iptables-min-sync-period -1s: must be greater than or equal to 0"},
		{"min above sync", []string{"--iptables-sync-period=1s", "--iptables-min-sync-period=2s"}, "--iptables-sync-period 1s: must be greater than or equal to --iptables-min-sync-period 2s"},
		{"min zero is kube-proxy's allowed value", []string{"--iptables-min-sync-period=0s"}, ""},
		{"ipvs sync zero", []string{"--proxy-mode=ipvs", "--ipvs-sync-period=0s"}, "--ipvs-sync-period 0s: must be greater than 0"},
		{"config sync negative", []string{"--config", config("nftables:\n  syncPeriod: -1s\n")}, "nftables.syncPeriod -1s: must be greater than 0"},
		{"config min negative", []string{"--config", config("nftables:\n  minSyncPeriod: -5s\n")}, "nftables.minSyncPeriod -5s: must be greater than or equal to 0"},
		{"config ipvs sync negative", []string{"--config", config("ipvs:\n  syncPeriod: -1m\n")}, "ipvs.syncPeriod -1m0s: must be greater than 0"},
		{"config ipvs min negative", []string{"--config", config("ipvs:\n  minSyncPeriod: -1s\n")}, "ipvs.minSyncPeriod -1s: must be greater than or equal to 0"},
		{"config min above default sync", []string{"--config", config("mode: nftables\nnftables:\n  minSyncPeriod: 1m\n")}, "--iptables-sync-period 30s: must be greater than or equal to --iptables-min-sync-period 1m0s"},
		{"config zero means default", []string{"--config", config("nftables:\n  syncPeriod: 0s\n  minSyncPeriod: 0s\n")}, ""},
		{"flag fixes a bad config", []string{"--config", config("nftables:\n  syncPeriod: -2s\n"), "--iptables-sync-period=10s"}, "nftables.syncPeriod -2s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.yaml")
			_, err := run(append(tt.args, "--write-config-to", out)...)
			_, statErr := os.Stat(out)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%v", err)
			case tt.want == "" && statErr != nil:
				t.Errorf("no config written: %v", statErr)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err %v, want it to mention %q", err, tt.want)
			case tt.want != "" && statErr == nil:
				t.Errorf("--write-config-to wrote a configuration that is refused")
			}
		})
	}
}

// A written configuration is read back unchanged and passes the same
// validation: --write-config-to never writes what --config refuses. (A
// minSyncPeriod of 0s would read back as the default 1s, as in kube-proxy,
// whose defaulting treats a zero period as unset.)
func TestWrittenConfigReadsBack(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first.yaml"), filepath.Join(dir, "second.yaml")
	if _, err := run("--iptables-min-sync-period=2s", "--iptables-sync-period=7s", "--write-config-to", first); err != nil {
		t.Fatal(err)
	}
	if _, err := run("--config", first, "--write-config-to", second); err != nil {
		t.Fatalf("the written config is refused: %v", err)
	}
	a, _ := os.ReadFile(first)
	b, _ := os.ReadFile(second)
	if string(a) != string(b) {
		t.Errorf("the config changed on a round trip:\n%s\nvs\n%s", a, b)
	}
}

// A --config file of several YAML documents is refused: the decoder reads
// only the first, so settings in the others would be silently dropped.
// A leading "---" and empty or comment-only documents are fine.
func TestConfigMultipleDocuments(t *testing.T) {
	const doc = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16\n"
	tests := []struct {
		name, body, want string
	}{
		{"two configurations", doc + "---\n" + doc, "more than one YAML document"},
		{"settings in a second document", doc + "---\nhostnameOverride: node-2\n", "more than one YAML document"},
		{"leading separator", "---\n" + doc, ""},
		{"trailing separator", doc + "---\n", ""},
		{"comment-only document", "# generated\n---\n" + doc + "---\n# end\n", ""},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(p, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := run("--config", p, "--write-config-to", filepath.Join(dir, "out.yaml"))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p)):
				t.Errorf("err %v, want it to name the file and mention %q", err, tt.want)
			}
		})
	}
}
