package leftover

import (
	"bytes"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// inNS runs a shell command in namespace ns and fails the test when it
// fails; it skips the test when a tool it needs is missing.
func inNS(t *testing.T, ns, script string) string {
	t.Helper()
	for _, tool := range []string{"iptables-nft-restore", "ip6tables-nft-restore", "ipset", "nft"} {
		if strings.Contains(script, tool) {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("needs %s (apt-get install iptables ipset nftables)", tool)
			}
		}
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-ec", script).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", ns, script, err, out)
	}
	return string(out)
}

const foreignScript = `
ipset create docker-set hash:ip
iptables-nft-restore --noflush < testdata/foreign-v4.rules
ip6tables-nft-restore --noflush < testdata/foreign-v6.rules
nft -f testdata/foreign.nft
`

const kubeProxyScript = `
ipset create KUBE-CLUSTER-IP hash:ip,port
ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6
iptables-nft-restore --noflush < testdata/kube-proxy-v4.rules
ip6tables-nft-restore --noflush < testdata/kube-proxy-v6.rules
nft -f testdata/kube-proxy.nft
`

// TestKernelClean puts iptables-mode and ipvs-mode kube-proxy chains (with
// iptables-nft itself), nftables-mode tables and ipvs-mode ipsets in a
// namespace next to someone else's rules (Docker-like chains and jumps in
// the same iptables-nft tables, kubelet's KUBE-FIREWALL and canaries, a
// foreign nft table, a foreign ipset), and checks that Clean leaves exactly
// what a second namespace holds with only the foreign objects.
func TestKernelClean(t *testing.T) {
	withKube := testns.New(t, "knp-left-")
	want := testns.New(t, "knp-left-want-")
	inNS(t, withKube, foreignScript)
	inNS(t, want, foreignScript)
	before := testns.NFT(t, withKube, "list", "ruleset")
	inNS(t, withKube, kubeProxyScript)
	if during := testns.NFT(t, withKube, "list", "ruleset"); during == before {
		t.Fatal("the kube-proxy rules did not change the ruleset")
	}

	res, err := Clean(Config{NetNS: testns.Path(withKube), Legacy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed: %q", res.Removed)
	got, exp := testns.NFT(t, withKube, "list", "ruleset"), testns.NFT(t, want, "list", "ruleset")
	if got != exp {
		t.Errorf("after Clean the ruleset differs from the foreign objects alone:\n%s", testutil.Diff(t, exp, got))
	}
	if got != before {
		t.Errorf("after Clean the ruleset differs from the one before kube-proxy's rules")
	}
	if sets := inNS(t, withKube, "ipset list -n"); strings.TrimSpace(sets) != "docker-set" {
		t.Errorf("ipsets after Clean: %q, want only docker-set", sets)
	}
	wantCounts := map[string]int{
		"nftables_table": 2,
		// v4: nat 12, filter 7, mangle 1; v6: nat 5, filter 2, mangle 1.
		"iptables_chain": 28,
		// v4: nat 3, filter 10; v6: nat 3, filter 2.
		"iptables_jump": 18,
		"ipset":         2,
	}
	if !maps.Equal(res.Counts, wantCounts) {
		t.Errorf("counts %v, want %v", res.Counts, wantCounts)
	}
	if len(res.Legacy) != 0 || len(res.BusyIPSets) != 0 {
		t.Errorf("legacy %v, busy ipsets %v: want none", res.Legacy, res.BusyIPSets)
	}

	// Nothing left: a second Clean finds nothing and changes nothing.
	res, err = Clean(Config{NetNS: testns.Path(withKube), Legacy: true})
	if err != nil || !res.Empty() {
		t.Errorf("second Clean: %+v, %v; want nothing found", res, err)
	}
	if again := testns.NFT(t, withKube, "list", "ruleset"); again != got {
		t.Errorf("the second Clean changed the ruleset")
	}
}

// TestKernelCleanNothing checks that Clean on a namespace with only
// someone else's objects finds nothing and changes nothing.
func TestKernelCleanNothing(t *testing.T) {
	ns := testns.New(t, "knp-left-")
	inNS(t, ns, foreignScript)
	before := testns.NFT(t, ns, "list", "ruleset")
	res, err := Clean(Config{NetNS: testns.Path(ns), Legacy: true, IPVS: true})
	if err != nil || !res.Empty() {
		t.Fatalf("Clean: %+v, %v; want nothing found", res, err)
	}
	if after := testns.NFT(t, ns, "list", "ruleset"); after != before {
		t.Errorf("Clean changed the ruleset:\n%s\n--- before\n%s", after, before)
	}
}

// TestKernelLegacy puts kube-proxy chains in iptables-legacy tables (with
// iptables-legacy itself) and checks that they are found and reported,
// never changed, and that reading never loads a legacy table that was not
// there.
func TestKernelLegacy(t *testing.T) {
	for _, tool := range []string{"iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install iptables)", tool)
		}
	}
	ns := testns.New(t, "knp-left-")
	// A namespace without legacy tables: reading must not create any.
	res, err := Clean(Config{NetNS: testns.Path(ns), Legacy: true})
	if err != nil || !res.Empty() {
		t.Fatalf("Clean: %+v, %v; want nothing found", res, err)
	}
	if names := inNS(t, ns, "cat /proc/net/ip_tables_names /proc/net/ip6_tables_names"); names != "" {
		t.Fatalf("reading loaded legacy tables: %q", names)
	}

	// The ipvs-mode rule uses an ipset, which then cannot be destroyed.
	inNS(t, ns, "ipset create KUBE-CLUSTER-IP hash:ip,port")
	out, err := exec.Command("ip", "netns", "exec", ns, "iptables-legacy-restore", "--noflush", "testdata/kube-proxy-v4.rules").CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("can't initialize")) || bytes.Contains(out, []byte("Table does not exist")) {
			t.Skipf("this kernel has no iptables-legacy: %s", out)
		}
		t.Fatalf("iptables-legacy-restore: %v: %s", err, out)
	}
	inNS(t, ns, "ip6tables-legacy-restore --noflush < testdata/kube-proxy-v6.rules")
	save := inNS(t, ns, "iptables-legacy-save; ip6tables-legacy-save")
	// Counters and dates differ between two saves.
	strip := func(s string) string {
		var b strings.Builder
		for l := range strings.Lines(s) {
			if !strings.HasPrefix(l, "#") {
				b.WriteString(l)
			}
		}
		return b.String()
	}

	res, err = Clean(Config{NetNS: testns.Path(ns), Legacy: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []Legacy{
		{"ip", "nat", []string{"KUBE-EXT-ABCDEFGHIJKLMNOP", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ", "KUBE-NODE-PORT", "KUBE-NODEPORTS", "KUBE-POSTROUTING",
			"KUBE-PROXY-CANARY", "KUBE-SEP-AAAAAAAAAAAAAAAA", "KUBE-SEP-BBBBBBBBBBBBBBBB", "KUBE-SERVICES", "KUBE-SVC-ABCDEFGHIJKLMNOP", "KUBE-SVL-ABCDEFGHIJKLMNOP"}},
		{"ip", "filter", []string{"KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-IPVS-FILTER", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY", "KUBE-PROXY-FIREWALL", "KUBE-SERVICES"}},
		{"ip", "mangle", []string{"KUBE-PROXY-CANARY"}},
		{"ip6", "nat", []string{"KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-SEP-CCCCCCCCCCCCCCCC", "KUBE-SERVICES", "KUBE-SVC-ABCDEFGHIJKLMNOP"}},
		{"ip6", "filter", []string{"KUBE-FORWARD", "KUBE-SERVICES"}},
		{"ip6", "mangle", []string{"KUBE-PROXY-CANARY"}},
	}
	if !slices.EqualFunc(res.Legacy, want, func(a, b Legacy) bool {
		return a.Family == b.Family && a.Table == b.Table && slices.Equal(a.Chains, b.Chains)
	}) {
		t.Errorf("legacy chains found:\n%v\nwant\n%v", res.Legacy, want)
	}
	if len(res.Removed) != 0 {
		t.Errorf("removed %q from a namespace with only legacy rules", res.Removed)
	}
	if !slices.Equal(res.BusyIPSets, []string{"KUBE-CLUSTER-IP"}) {
		t.Errorf("busy ipsets %q, want KUBE-CLUSTER-IP (a legacy rule uses it)", res.BusyIPSets)
	}
	if after := inNS(t, ns, "iptables-legacy-save; ip6tables-legacy-save"); strip(after) != strip(save) {
		t.Errorf("the legacy tables changed:\n%s\n--- before\n%s", after, save)
	}

	var log bytes.Buffer
	Log(slog.New(slog.NewTextHandler(&log, nil)), res, false)
	for _, w := range []string{"level=WARN", "table=\"ip nat\"", "chains=12", "iptables-legacy-save | grep", "ip6tables-legacy-save", "kube-proxy --cleanup", "ipsets=[KUBE-CLUSTER-IP]"} {
		if !strings.Contains(log.String(), w) {
			t.Errorf("log %q lacks %q", log.String(), w)
		}
	}
}

// BenchmarkKernelLook is the Watcher's periodic look on a node with
// someone else's iptables-nft tables and no kube-proxy rules (the common
// case): the tables listed, kube-proxy's fixed chains looked up.
func BenchmarkKernelLook(b *testing.B) {
	ns := testns.New(b, "knp-left-")
	if out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-ec", foreignScript).CombinedOutput(); err != nil {
		b.Skipf("someone else's rules: %v: %s", err, out)
	}
	w := &Watcher{Config: Config{NetNS: testns.Path(ns), IPVS: true}}
	for b.Loop() {
		if w.present() {
			b.Fatal("found kube-proxy's objects in a namespace without them")
		}
	}
}
