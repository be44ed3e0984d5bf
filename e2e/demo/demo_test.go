package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kernel test in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: the demo needs root to create network namespaces")
	}
}

// runDemo runs the demo with the given proxy on the example state and
// returns its output.
func runDemo(t *testing.T, proxy, state string, ruleset bool) (string, error) {
	t.Helper()
	agent, err := testbin.Agent(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = run(ctx, config{
		Proxy:    proxy,
		Agent:    agent,
		State:    state,
		ProxyLog: filepath.Join(t.TempDir(), "proxy.log"),
		Wait:     30 * time.Second,
		Ruleset:  ruleset,
		Out:      &out,
		Err:      &out,
	})
	t.Logf("demo output:\n%s", out.String())
	return out.String(), err
}

func checkOutput(t *testing.T, out string, ruleset bool) {
	t.Helper()
	want := []string{
		"== Requests (10 per flow)",
		"  TCP from pod-a to ClusterIP 10.96.0.10:80\n    answered by  ",
		"  TCP from the client to NodePort 10.99.0.1:30080\n    answered by  ",
		"(masqueraded: from outside the cluster to a NodePort, externalTrafficPolicy Cluster) x",
		"  UDP from pod-b to ClusterIP 10.96.0.53:53\n    answered by  ",
		"  TCP from pod-b to IPv6 ClusterIP [fd00:10:96::10]:80\n    answered by  ",
		"; 0 failed\n",
		"Proxy stopped (SIGTERM, exit 0).",
		"deleted.",
	}
	shown, hint := "== nft list ruleset (node)", "make demo DEMO_FLAGS=--ruleset"
	if ruleset {
		want = append(want, shown)
	} else {
		want = append(want, hint)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if strings.Contains(out, "FAILED") || strings.Contains(out, "error:") {
		t.Error("a request failed")
	}
	if !ruleset && strings.Contains(out, shown) {
		t.Error("the ruleset was printed unasked")
	}
}

// TestDemoFakeProxy runs the demo against a shell script that programs the
// example Services with nft: it tests the demo, not the proxy.
func TestDemoFakeProxy(t *testing.T) {
	needRoot(t)
	out, err := runDemo(t, "testdata/fake-proxy.sh", t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	checkOutput(t, out, false)
}

// TestDemo is `make demo`: the real proxy on examples/demo.
func TestDemo(t *testing.T) {
	needRoot(t)
	root := filepath.Join("..", "..")
	if files, _ := filepath.Glob(filepath.Join(root, "cmd", "kube-nftproxy", "*.go")); len(files) == 0 {
		t.Skip("skipping: no cmd/kube-nftproxy yet")
	}
	state := filepath.Join(root, "examples", "demo")
	if files, _ := filepath.Glob(filepath.Join(state, "*.yaml")); len(files) == 0 {
		t.Skip("skipping: no examples/demo state yet")
	}
	proxy, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := runDemo(t, proxy, state, true)
	if err != nil {
		t.Fatal(err)
	}
	checkOutput(t, out, true)
	for _, want := range []string{"table ip kube-nftproxy", "table ip6 kube-nftproxy"} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
}
