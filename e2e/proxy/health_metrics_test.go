package proxy

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestHealthProbeMetrics: kube-proxy's kubeproxy_proxy_healthz_total and
// kubeproxy_proxy_livez_total count the answers of the real binary's
// /healthz and /livez by status code. As kube-proxy, /healthz answers 200
// while a broken state file holds back the first sync; our /readyz
// answers 503 meanwhile, and is not counted.
func TestHealthProbeMetrics(t *testing.T) {
	t.Parallel()
	needRoot(t)
	sb := newSandbox(t, []sandbox.Pod{podA, podB})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	writeAtomic(t, state, "broken.yaml", brokenYAML)
	p := launchProxy(t, sb, 5*time.Second, proxyCommand(state, "--healthz-bind-address", "127.0.0.1:"+healthPort)...)
	e := &apiEnv{env: &env{sb: sb, proxy: p}}
	get := func(path string) int {
		t.Helper()
		var code int
		p.poll(t, 10*time.Second, path, func(ctx context.Context) error {
			var err error
			code, _, err = e.health(ctx, path)
			return err
		})
		return code
	}
	counts := map[string]int{}
	probe := func(path string, want int) {
		t.Helper()
		if code := get(path); code != want {
			t.Fatalf("%s answered %d, want %d", path, code, want)
		}
		counts[fmt.Sprintf(`kubeproxy_proxy_%s_total{code="%d"}`, path[1:], want)]++
	}
	for range 3 {
		probe("/healthz", http.StatusOK)
		if code := get("/readyz"); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz answered %d before the first sync, want 503", code)
		}
	}
	probe("/livez", http.StatusOK)
	writeAtomic(t, state, "broken.yaml", "# fixed: empty\n")
	p.waitLog(t, 10*time.Second, "the first sync once the file is fixed", func(lines []string) bool {
		return countSyncs(lines) > 0
	})
	for range 2 {
		probe("/healthz", http.StatusOK)
		probe("/livez", http.StatusOK)
	}
	var m metrics
	p.poll(t, 10*time.Second, "/metrics", func(ctx context.Context) error {
		var err error
		m, err = e.fetchMetrics(ctx)
		return err
	})
	for name, want := range counts {
		if got := m[name]; got != float64(want) {
			t.Errorf("%s = %v, want %d", name, got, want)
		}
	}
	for _, probe := range []string{"healthz", "livez"} {
		name := fmt.Sprintf(`kubeproxy_proxy_%s_total{code="503"}`, probe)
		if got, ok := m[name]; ok {
			t.Errorf(`%s = %v, want absent (never answered; /readyz's 503s are not counted)`, name, got)
		}
	}
}
