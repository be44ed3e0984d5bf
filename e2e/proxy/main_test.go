package proxy

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

// proxyEnv names the environment variable that points the tests at a
// prebuilt kube-nftproxy instead of building one.
const proxyEnv = "E2E_PROXY"

// Paths of the binaries under test, set by TestMain when the kernel tests run.
var proxyBin, agentBin string

func TestMain(m *testing.M) {
	flag.Parse() // for testing.Short
	os.Exit(func() int {
		if os.Geteuid() != 0 || testing.Short() {
			return m.Run() // the kernel tests skip themselves
		}
		dir, err := os.MkdirTemp("", "proxy-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if proxyBin, err = proxyBinary(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if agentBin, err = testbin.Agent(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// proxyBinary returns $E2E_PROXY if set, else a kube-nftproxy freshly built
// into dir.
func proxyBinary(dir string) (string, error) {
	if p := os.Getenv(proxyEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("$%s: %w", proxyEnv, err)
		}
		return abs, nil
	}
	return testbin.Build(testbin.Module+"/cmd/kube-nftproxy", dir)
}

// Every test but two calls t.Parallel: each runs in sandbox namespaces of
// its own, and most of their time is waiting (for an API server to start,
// for timers, for traffic), so they overlap well. TestFaultBadInput and
// TestFaultForeignChainsRepairedInPlace stay serial: they time CPU-bound
// work (a 50 MB input, repairs racing a foreign writer) against limits.

// needRoot skips kernel tests in -short mode and when not root.
func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kernel test in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces and program nftables (run the kernel tests as root: make e2e)")
	}
}
