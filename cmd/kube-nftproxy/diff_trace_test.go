package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

func demoOptions() *options {
	return &options{statePath: "../../examples/demo", hostnameOverride: "node-1", clusterCIDR: "10.244.0.0/16",
		detectLocalMode: "ClusterCIDR", masqueradeBit: 14}
}

func TestRunDiffExitCodes(t *testing.T) {
	good := "../../migrate/testdata/demo/iptables-save.txt"
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(t.TempDir(), "changed.txt")
	if err := os.WriteFile(changed, bytes.ReplaceAll(b, []byte("10.244.0.11:8080"), []byte("10.244.0.12:8080")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dumps []string
		stdin string
		code  int
		out   string
	}{
		{dumps: []string{good}, code: exitEqual, out: "2 service ports: 2 equal"},
		{dumps: []string{"-"}, stdin: string(b), code: exitEqual, out: "default/web:http tcp: equal"},
		{dumps: []string{changed}, code: exitDifferent, out: "default/web:http tcp: different: endpoints"},
		{dumps: []string{"../../README.md"}, code: exitBadInput},
		{dumps: []string{"/nonexistent"}, code: exitBadInput},
		{dumps: nil, code: exitBadInput},
	} {
		var out, errOut bytes.Buffer
		code, err := runDiff(&out, strings.NewReader(tc.stdin), &errOut, demoOptions(), tc.dumps)
		if code != tc.code || !strings.Contains(out.String(), tc.out) {
			t.Errorf("diff %v: exit %d (%v), output %q; want exit %d with %q", tc.dumps, code, err, out.String(), tc.code, tc.out)
		}
	}
}

func TestTraceOutput(t *testing.T) {
	rs, local, err := traceRuleset(demoOptions(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, dst string
		fromNode bool
		want     []string
	}{
		{"10.244.0.12", "10.96.0.10:80", false, []string{"verdict: accept", "dnat targets: 10.244.0.10:8080 50%, 10.244.0.11:8080 50%", "masquerade: no",
			"nat-prerouting > KUBE-SERVICES > KUBE-SVC-CDGGSHYLG3RE2FKL > KUBE-SEP-3MRQQDVYO2GBIBDV"}},
		{"10.99.0.2", "10.99.0.1:30053/udp", false, []string{"dnat targets: 10.244.0.10:5353 50%, 10.244.0.11:5353 50%", "masquerade: yes",
			"\n    ip kube-nftproxy-affinity, kube-nftproxy-delta: nat-prerouting > KUBE-SERVICES > KUBE-NODEPORTS\n    ip kube-nftproxy: nat-prerouting > KUBE-SERVICES > KUBE-NODEPORTS > KUBE-EXT-Z5GLIDLRMQRBGBSD > KUBE-MARK-MASQ > KUBE-SVC-Z5GLIDLRMQRBGBSD > KUBE-SEP-"}},
		{"10.99.0.1", "10.96.0.53:53/udp", true, []string{"(sent by the node)", "ip kube-nftproxy: nat-output > KUBE-SERVICES > KUBE-SVC-Z5GLIDLRMQRBGBSD", "masquerade: yes"}},
		{"10.244.0.12", "10.96.0.99:80", false, []string{"verdict: accept", "dnat targets: none: no Service port holds 10.96.0.99:80/tcp", "masquerade: no"}},
	} {
		p, err := parsePacket(tc.src, tc.dst, "", tc.fromNode)
		if err != nil {
			t.Fatal(err)
		}
		p.Local = local
		outcomes, err := rs.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := writeTrace(&out, p, outcomes, baseChains(rs, p)); err != nil {
			t.Fatal(err)
		}
		checkPathsOnce(t, out.String())
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("trace %s -> %s:\n%s\nlacks %q", tc.src, tc.dst, out.String(), w)
			}
		}
	}
	for _, bad := range [][2]string{{"", "10.96.0.10:80"}, {"10.0.0.1", "10.96.0.10"}, {"10.0.0.1", "[fd00::1]:80"}, {"10.0.0.1", "10.96.0.10:80/icmp"}, {"nope", "10.96.0.10:80"}} {
		if _, err := parsePacket(bad[0], bad[1], "", false); err == nil {
			t.Errorf("parsePacket(%q, %q): no error", bad[0], bad[1])
		}
	}
}

// diff of upstream's real dump against a render without --cluster-cidr
// says that is probably what is missing, and with it says equal.
func TestRunDiffMissingClusterCIDR(t *testing.T) {
	dir := "../../migrate/testdata/upstream-localhost"
	dumps := []string{dir + "/iptables-legacy-save.txt", dir + "/ip6tables-legacy-save.txt"}
	for _, tc := range []struct {
		cidr string
		code int
		want string
	}{
		{"", exitDifferent, "probably missing: --cluster-cidr 10.244.0.0/16,fd00:10:244::/48: iptables masquerades traffic to Service IPs from outside it, ours by no such range: run ours (or diff --state) with kube-proxy's --cluster-cidr; 13 of the 13 Service ports that differ differ by that alone\n"},
		{"10.244.0.0/16,fd00:10:244::/48", exitEqual, "18 service ports: 18 equal"},
	} {
		o := &options{statePath: dir + "/objects.json", hostnameOverride: "node-1", clusterCIDR: tc.cidr, masqueradeBit: 14, detectLocalMode: "ClusterCIDR", proxyMode: modeIPTables, localhostNodePorts: true}
		var out bytes.Buffer
		code, err := runDiff(&out, strings.NewReader(""), &bytes.Buffer{}, o, dumps)
		if code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("--cluster-cidr %q: exit %d (%v), want %d with %q:\n%s", tc.cidr, code, err, tc.code, tc.want, out.String())
		}
		if tc.code == exitEqual && strings.Contains(out.String(), "probably missing") {
			t.Errorf("--cluster-cidr %q: a hint though equal:\n%s", tc.cidr, out.String())
		}
	}
}

// checkPathsOnce: no two paths of a trace are the same, and no part of a
// path is printed twice.
func checkPathsOnce(t *testing.T, out string) {
	t.Helper()
	blocks := regexp.MustCompile(`(?m)^path \d+ \([^)]*\): `).Split(out, -1)[1:]
	seen := map[string]bool{}
	for _, b := range blocks {
		b = b[:strings.LastIndex(b, "    ")] // the last part and the summary
		if seen[b] {
			t.Errorf("a path printed twice:\n%s", out)
		}
		seen[b] = true
		lines := strings.Split(b, "\n")
		for i := 1; i+1 < len(lines); i++ {
			if _, chains, _ := strings.Cut(lines[i], ": "); i > 1 && strings.HasSuffix(lines[i-1], ": "+chains) {
				t.Errorf("a part printed twice in a row:\n%s", out)
			}
		}
	}
}

// Ways through that end the same, by the same chains of the same tables,
// are one path with their probabilities added up.
func TestTraceMergesSamePaths(t *testing.T) {
	p := nftlib.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.1"), Dport: 80, Proto: 6}
	dnat := netip.MustParseAddrPort("10.244.0.1:80")
	way := nftlib.Outcome{Prob: 0.25, DNAT: dnat, Chains: []string{"nat-prerouting", "KUBE-SERVICES", "nat-prerouting", "KUBE-SERVICES", "KUBE-SVC-A"},
		Tables: []string{"t-delta", "t-delta", "t", "t", "t"}}
	other := way
	other.Prob, other.DNAT = 0.5, netip.MustParseAddrPort("10.244.0.2:80")
	base := map[[2]string]bool{{"t-delta", "nat-prerouting"}: true, {"t", "nat-prerouting"}: true}
	var out bytes.Buffer
	if err := writeTrace(&out, p, []nftlib.Outcome{way, other, way}, base); err != nil {
		t.Fatal(err)
	}
	want := "path 1 (50%): accept, dnat to 10.244.0.1:80, source kept\n    ip t-delta: nat-prerouting > KUBE-SERVICES\n    ip t: nat-prerouting > KUBE-SERVICES > KUBE-SVC-A\n" +
		"path 2 (50%): accept, dnat to 10.244.0.2:80, source kept\n"
	if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "path 3") {
		t.Errorf("trace:\n%s\nwant:\n%s", out.String(), want)
	}
	checkPathsOnce(t, out.String())
}

// diff in nftables mode of a dump of kube-proxy's default iptables mode
// differs in the NodePorts on localhost and on every address, and says
// that in iptables mode every difference goes away; in iptables mode it
// is equal and says nothing of the kind.
func TestRunDiffOtherModeHint(t *testing.T) {
	dir := "../../migrate/testdata/upstream-localhost"
	base := []string{"diff", "--iptables-save", dir + "/iptables-legacy-save.txt", "--iptables-save", dir + "/ip6tables-legacy-save.txt",
		"--state", dir + "/objects.json", "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48"}
	for _, tc := range []struct {
		args       []string
		code       int
		mode, hint string
	}{
		{[]string{"--proxy-mode", "nftables"}, exitDifferent, "mode: nftables (--proxy-mode); NodePorts on the Node's primary addresses\n",
			"probably: --proxy-mode iptables: in that mode (NodePorts on every local address and 127.0.0.0/8) every difference goes away"},
		// The addresses given stay in the other mode, where the NodePorts
		// still differ: no hint.
		{[]string{"--proxy-mode", "nftables", "--nodeport-addresses", "10.99.0.1/32"}, exitDifferent, "NodePorts on 10.99.0.1/32\n", ""},
		{nil, exitEqual, "mode: iptables (--proxy-mode not set: kube-proxy's default); NodePorts on every local address and 127.0.0.0/8\n", ""},
		{[]string{"--proxy-mode", "iptables", "--iptables-localhost-nodeports=false"}, exitDifferent, "mode: iptables (--proxy-mode); NodePorts on every local address\n", ""},
	} {
		out, code := runCommand(append(base, tc.args...))
		first, _, _ := strings.Cut(out, "\n")
		if code != tc.code || !strings.Contains(first+"\n", tc.mode) || strings.Contains(out, "probably: ") != (tc.hint != "") || !strings.Contains(out, tc.hint) {
			t.Errorf("diff %v: exit %d, want %d, a first line with %q and hint %q:\n%s", tc.args, code, tc.code, tc.mode, tc.hint, out)
		}
	}
}
