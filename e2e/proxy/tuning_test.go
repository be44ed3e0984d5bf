package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The conntrack keys the tuning writes; the first is global (read-only
// outside the initial network namespace), the others per namespace.
const tuningMaxKey = "net/netfilter/nf_conntrack_max"

var tuningPerNetns = []string{
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"net/netfilter/nf_conntrack_udp_timeout",
	"net/netfilter/nf_conntrack_udp_timeout_stream",
	"net/netfilter/nf_conntrack_tcp_be_liberal",
}

// tuningRead reads a key in namespace ns ("" for the test's own, the host's).
func tuningRead(t *testing.T, sb *sandbox.Sandbox, ns, key string) int {
	t.Helper()
	p := filepath.Join("/proc/sys", key)
	var b []byte
	var err error
	if ns == "" {
		b, err = os.ReadFile(p)
	} else {
		b, err = sb.Exec(t.Context(), ns, "cat", p)
	}
	if err != nil {
		t.Fatalf("reading %s in %q: %v", key, ns, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s in %q: %v", key, ns, err)
	}
	return n
}

// TestConntrackTuning runs the proxy in the node namespace with kube-proxy's
// --conntrack-* flags: the per-namespace conntrack sysctls change there and
// nowhere else (not on the host, not in the client namespace); the global
// nf_conntrack_max, read-only there, gives one warning naming it, and the
// proxy runs on and programs its rules.
//
// The hash size (/sys/module/nf_conntrack/parameters/hashsize) is global,
// and the test must never write it: the max asked for is chosen so that the
// hash size is already large enough, and otherwise the max is left alone.
func TestConntrackTuning(t *testing.T) {
	t.Parallel()
	needRoot(t)
	if _, err := os.Stat(filepath.Join("/proc/sys", tuningMaxKey)); err != nil {
		t.Skipf("skipping: no conntrack sysctls on this kernel: %v", err)
	}
	sb := newSandbox(t, []sandbox.Pod{})
	state := t.TempDir()
	copyDir(t, exampleState, state)

	keys := append([]string{tuningMaxKey}, tuningPerNetns...)
	host, node, client := map[string]int{}, map[string]int{}, map[string]int{}
	for _, k := range keys {
		host[k] = tuningRead(t, sb, "", k)
		node[k] = tuningRead(t, sb, sandbox.Node, k)
		client[k] = tuningRead(t, sb, sandbox.Client, k)
	}
	t.Logf("before: host %v, node %v", host, node)
	if node[tuningPerNetns[4]] != 0 {
		t.Fatalf("nf_conntrack_tcp_be_liberal is already 1 in a new namespace: the test could not see it change")
	}
	// Values neither the host nor a new namespace has.
	want := map[string]int{}
	for i, k := range tuningPerNetns[:4] {
		for v := 1001 + 100*i; ; v++ {
			if v != host[k] && v != node[k] {
				want[k] = v
				break
			}
		}
	}
	want[tuningPerNetns[4]] = 1
	args := []string{
		"--conntrack-tcp-timeout-established", fmt.Sprintf("%ds", want[tuningPerNetns[0]]),
		"--conntrack-tcp-timeout-close-wait", fmt.Sprintf("%ds", want[tuningPerNetns[1]]),
		"--conntrack-udp-timeout", fmt.Sprintf("%ds", want[tuningPerNetns[2]]),
		"--conntrack-udp-timeout-stream", fmt.Sprintf("%ds", want[tuningPerNetns[3]]),
		"--conntrack-tcp-be-liberal",
	}
	// Ask for more than nf_conntrack_max only if the hash size needs no
	// raise for it (kube-proxy wants max/4 buckets).
	wantMax := host[tuningMaxKey] + 4
	hashsize := 0
	if b, err := os.ReadFile("/sys/module/nf_conntrack/parameters/hashsize"); err == nil {
		hashsize, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	maxWarning := hashsize >= wantMax/4
	if maxWarning {
		args = append(args, "--conntrack-max-per-core", "1", "--conntrack-min", strconv.Itoa(wantMax))
	} else {
		t.Logf("hashsize %d < %d/4: leaving nf_conntrack_max alone (--conntrack-max-per-core=0), not to write the global hash size", hashsize, wantMax)
		args = append(args, "--conntrack-max-per-core", "0")
	}

	p := startProxy(t, sb, state, args...)

	for _, k := range keys {
		wantNode, ok := want[k]
		if !ok {
			wantNode = node[k]
		}
		if got := tuningRead(t, sb, sandbox.Node, k); got != wantNode {
			t.Errorf("%s in the node namespace = %d, want %d", k, got, wantNode)
		}
		if got := tuningRead(t, sb, "", k); got != host[k] {
			t.Errorf("%s on the host = %d, want %d unchanged", k, got, host[k])
		}
		if got := tuningRead(t, sb, sandbox.Client, k); got != client[k] {
			t.Errorf("%s in the client namespace = %d, want %d unchanged", k, got, client[k])
		}
	}

	var warnings []string
	for _, l := range p.log.lines() {
		if isWarningLine(l) && strings.Contains(l, "conntrack tuning") {
			warnings = append(warnings, l)
		}
	}
	switch {
	case !maxWarning && len(warnings) != 0:
		t.Errorf("tuning warnings %q, want none", warnings)
	case maxWarning && (len(warnings) != 1 || !strings.Contains(warnings[0], `key="/proc/sys/`+tuningMaxKey+`"`) || !strings.Contains(warnings[0], "read-only")):
		t.Errorf("tuning warnings %q, want one saying nf_conntrack_max is read-only", warnings)
	}
	// The proxy runs on: it synced (startProxy waited for it) and has its tables.
	if got := nftTables(t, sb); len(got) == 0 {
		t.Errorf("no tables in the node namespace after the tuning")
	}
}
