package proxy

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestCleanup checks that --cleanup removes the proxy's tables, and only
// them, puts back the sysctls the proxy changed, and that a second
// --cleanup succeeds with nothing to do.
func TestCleanup(t *testing.T) {
	t.Parallel()
	needRoot(t)
	sb := newSandbox(t, []sandbox.Pod{})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	// kube-proxy's conntrack timeouts (24 h, 1 h), which the node's new
	// namespace does not have yet.
	const established = "net/netfilter/nf_conntrack_tcp_timeout_established"
	before := nodeSysctl(t, sb, established)
	if before == "86400" {
		t.Fatalf("%s is already 86400: the test cannot see the proxy change it", established)
	}

	p := startProxy(t, sb, state)
	// Like kube-proxy, the proxy leaves its rules in place when it
	// stops, so that Services keep working across a restart.
	if err := p.proc.Stop(5 * time.Second); err != nil {
		t.Fatalf("proxy on SIGTERM: %v (want exit status 0)", err)
	}
	tables := nftTables(t, sb)
	if got := nodeSysctl(t, sb, established); got != "86400" {
		t.Fatalf("the proxy left %s = %s, want kube-proxy's 86400", established, got)
	}
	for _, want := range []string{"table ip kube-nftproxy", "table ip6 kube-nftproxy", "table ip kube-nftproxy-sysctls"} {
		if !slices.Contains(tables, want) {
			t.Fatalf("after the proxy stopped: no %q in %q", want, tables)
		}
	}

	// Someone else's table, which --cleanup must leave alone.
	const foreign = "table ip kube-nftproxy-not"
	if _, err := sb.Exec(t.Context(), sandbox.Node, "nft", "add", foreign); err != nil {
		t.Fatal(err)
	}

	out := cleanup(t, sb)
	if !strings.Contains(out, "removed") {
		t.Errorf("first --cleanup printed %q, want it to say it removed the tables", out)
	}
	if got := nftTables(t, sb); !slices.Equal(got, []string{foreign}) {
		t.Errorf("after --cleanup the node has tables %q, want only %q", got, foreign)
	}
	if got := nodeSysctl(t, sb, established); got != before || !strings.Contains(out, "put back /proc/sys/"+established) {
		t.Errorf("after --cleanup %s = %s, want it put back to %s and said so", established, got, before)
	}

	out = cleanup(t, sb)
	if !strings.Contains(out, "nothing to clean up") {
		t.Errorf("second --cleanup printed %q, want it to say there was nothing to clean up", out)
	}
	if got := nftTables(t, sb); !slices.Equal(got, []string{foreign}) {
		t.Errorf("after the second --cleanup the node has tables %q, want only %q", got, foreign)
	}
}

// cleanup runs `kube-nftproxy --cleanup` in the node namespace, fails the
// test unless it exits 0, and returns its standard output.
func cleanup(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()
	out, err := sb.Exec(t.Context(), sandbox.Node, proxyBin, "--cleanup")
	if err != nil {
		t.Fatalf("%v (want exit status 0)\nstdout: %s", err, out)
	}
	t.Logf("kube-nftproxy --cleanup: %s", out)
	return string(out)
}

// nftTables lists the node's tables ("table ip kube-nftproxy", ...).
func nftTables(t *testing.T, sb *sandbox.Sandbox) []string {
	t.Helper()
	out, err := sb.Exec(t.Context(), sandbox.Node, "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for line := range strings.Lines(string(out)) {
		if line = strings.TrimSpace(line); line != "" {
			tables = append(tables, line)
		}
	}
	slices.Sort(tables)
	return tables
}

// nodeSysctl reads a sysctl of the node's network namespace.
func nodeSysctl(t *testing.T, sb *sandbox.Sandbox, key string) string {
	t.Helper()
	out, err := sb.Exec(t.Context(), sandbox.Node, "cat", "/proc/sys/"+key)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
