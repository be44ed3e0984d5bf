package proxy

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestIPVSModeWithoutIPVS: on a kernel without IPVS (this machine's), the
// real binary with --proxy-mode ipvs stops at once with a message naming
// the problem and the fix, exits non-zero, and programs nothing.
func TestIPVSModeWithoutIPVS(t *testing.T) {
	t.Parallel()
	needRoot(t)
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("this kernel has IPVS")
	}
	sb := newSandbox(t, []sandbox.Pod{})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	start := time.Now()
	_, err := sb.Exec(t.Context(), sandbox.Node, proxyBin, "--proxy-mode", "ipvs", "--state", state,
		"--hostname-override", "node-1", "--healthz-bind-address", "", "--metrics-bind-address", "")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("err = %v; want a non-zero exit", err)
	}
	for _, want := range []string{"the kernel has no IPVS", "/proc/net/ip_vs is missing", "--proxy-mode nftables"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to give up", d)
	}
	if tables := nftTables(t, sb); len(tables) != 0 {
		t.Errorf("tables after the failed start: %q", tables)
	}
	// --cleanup on this kernel is fine: nothing of IPVS mode to remove.
	if out := cleanup(t, sb); !strings.Contains(out, "nothing to clean up") {
		t.Errorf("--cleanup printed %q", out)
	}
}
