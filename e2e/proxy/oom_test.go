package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestOOMScoreAdj: the real binary sets its oom_score_adj at start from
// --oom-score-adj or oomScoreAdj in --config (which, as in kube-proxy,
// makes the process ignore the flag, with a warning), -999 by default. Lowering it needs CAP_SYS_RESOURCE: without it
// (as in some CI containers, and the DaemonSet in deploy/), the value stays
// and the proxy says why at --v=2, as kube-proxy does, and runs on.
func TestOOMScoreAdj(t *testing.T) {
	t.Parallel()
	needRoot(t)
	sb := newSandbox(t, []sandbox.Pod{podA})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	// The settings proxyCommand gives as flags, which --config overrides.
	body := fmt.Sprintf("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n"+
		"clusterCIDR: %s\nnftables: {minSyncPeriod: 100ms}\noomScoreAdj: -500\n", clusterCIDRs())
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	inherited, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want int
		warn string // a warning the proxy logs
	}{
		{nil, -999, ""},
		{[]string{"--config", cfg}, -500, ""},
		{[]string{"--config", cfg, "--oom-score-adj", "300"}, -500, `flag="--oom-score-adj" value="300" config="-500"`},
	} {
		t.Run(strings.Join(append([]string{"args"}, tt.args...), " "), func(t *testing.T) {
			p := startProxy(t, sb, state, append([]string{"--v=2"}, tt.args...)...)
			pid := p.proc.Pid()
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil || !strings.Contains(string(status), "Name:\tkube-nftproxy\n") {
				t.Fatalf("pid %d is not the proxy (%v):\n%s", pid, err, status)
			}
			got, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
			if err != nil {
				t.Fatal(err)
			}
			// Set before the first sync, which startProxy waited for.
			want := strconv.Itoa(tt.want)
			lowering := tt.want < atoi(t, string(inherited))
			if lowering && !hasCap(t, string(status), capSysResource) {
				want = strings.TrimSpace(string(inherited))
				if !slices.ContainsFunc(p.log.lines(), func(l string) bool {
					return strings.Contains(l, "could not set the OOM score adjustment") && strings.Contains(l, "value="+strconv.Itoa(tt.want))
				}) {
					t.Errorf("no CAP_SYS_RESOURCE to lower oom_score_adj to %d, and the proxy did not say so", tt.want)
				}
				t.Logf("no CAP_SYS_RESOURCE: oom_score_adj %d cannot be set; the proxy logged why", tt.want)
			}
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("oom_score_adj %q; want %s", got, want)
			}
			if tt.warn != "" && !slices.ContainsFunc(p.log.lines(), func(l string) bool { return strings.Contains(l, tt.warn) }) {
				t.Errorf("no warning %s", tt.warn)
			}
			p.stop(t)
		})
	}
}

const capSysResource = 24

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// hasCap reports whether a /proc/PID/status shows capability c effective.
func hasCap(t *testing.T, status string, c uint) bool {
	t.Helper()
	for _, l := range strings.Split(status, "\n") {
		if hex, ok := strings.CutPrefix(l, "CapEff:\t"); ok {
			v, err := strconv.ParseUint(hex, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v&(1<<c) != 0
		}
	}
	t.Fatal("no CapEff in the process status")
	return false
}
