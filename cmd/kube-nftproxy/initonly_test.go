package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// initOnlySysctls are the per-network-namespace keys --init-only sets in
// TestInitOnly, with the flag that sets each and a value no kernel has by
// default.
var initOnlySysctls = []struct{ key, flag, want string }{
	{"net/netfilter/nf_conntrack_tcp_timeout_established", "--conntrack-tcp-timeout-established=12345s", "12345"},
	{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "--conntrack-tcp-timeout-close-wait=2345s", "2345"},
	{"net/netfilter/nf_conntrack_udp_timeout", "--conntrack-udp-timeout=33s", "33"},
	{"net/netfilter/nf_conntrack_udp_timeout_stream", "--conntrack-udp-timeout-stream=123s", "123"},
	{"net/netfilter/nf_conntrack_tcp_be_liberal", "--conntrack-tcp-be-liberal", "1"},
	// iptables mode (the default) serves NodePorts on localhost.
	{"net/ipv4/conf/all/route_localnet", "", "1"},
}

// TestInitOnly runs the real process with --init-only in a network
// namespace of its own (never in the test's): it sets the conntrack
// sysctls and route_localnet there and exits 0 without an API server,
// and the test's own namespace keeps its values. nf_conntrack_max is
// global, so --conntrack-max-per-core=0 leaves it alone.
func TestInitOnly(t *testing.T) {
	ns := testns.New(t, "knp-init-")
	inNS := []string{"ip", "netns", "exec", ns}
	if _, err := os.Stat("/proc/sys/" + initOnlySysctls[0].key); err != nil {
		t.Skipf("no conntrack sysctls here (nf_conntrack not loaded?): %v", err)
	}
	host := map[string]string{}
	for _, s := range initOnlySysctls {
		host[s.key] = readSysctl(t, nil, s.key)
		if host[s.key] == s.want && s.want != "1" {
			t.Fatalf("%s is already %s in the test's namespace: the test could not tell", s.key, s.want)
		}
	}
	maxBefore := readSysctl(t, nil, "net/netfilter/nf_conntrack_max")

	args := []string{"--init-only", "--conntrack-max-per-core=0", "--kubeconfig", filepath.Join(t.TempDir(), "absent")}
	for _, s := range initOnlySysctls {
		if s.flag != "" {
			args = append(args, s.flag)
		}
	}
	_, stderr, err := runMain(t, inNS, args...)
	if err != nil {
		t.Fatalf("--init-only: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "system initialized and --init-only given; exiting") {
		t.Errorf("no exit line in:\n%s", stderr)
	}
	for _, s := range initOnlySysctls {
		if got := readSysctl(t, inNS, s.key); got != s.want {
			t.Errorf("in the namespace, %s = %s; want %s", s.key, got, s.want)
		}
		if got := readSysctl(t, nil, s.key); got != host[s.key] {
			t.Errorf("in the test's namespace, %s changed: %s, was %s", s.key, got, host[s.key])
		}
	}
	if got := readSysctl(t, nil, "net/netfilter/nf_conntrack_max"); got != maxBefore {
		t.Errorf("nf_conntrack_max changed: %s, was %s", got, maxBefore)
	}
}

// readSysctl reads /proc/sys/key, through wrapper (a command that runs
// the next in another namespace) when given.
func readSysctl(t *testing.T, wrapper []string, key string) string {
	t.Helper()
	argv := append(append([]string{}, wrapper...), "cat", "/proc/sys/"+key)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", argv, err, out)
	}
	return strings.TrimSpace(string(out))
}
