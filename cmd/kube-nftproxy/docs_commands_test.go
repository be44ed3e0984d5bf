package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// The dump of a real kube-proxy v1.37.1 in iptables mode (its defaults,
// localhost NodePorts included) and the objects it programmed: the inputs a
// user following docs/migration.md has.
const (
	docDumps        = "../../migrate/testdata/upstream-localhost"
	docClusterCIDRs = "10.244.0.0/16,fd00:10:244::/48"
	// docNFTDump is a real listing of kube-proxy v1.37.1's nftables mode
	// and its objects, for the commands with --nft-ruleset.
	docNFTDump = "../../migrate/testdata/upstream-nftables"
)

// docCommand matches the render, diff and trace commands the docs show, in
// code spans (which may be wrapped over lines) or lines of code blocks.
var docCommand = regexp.MustCompile("`(kube-nftproxy (?:render|diff|trace) [^`]*)`|(?m)^(kube-nftproxy (?:render|diff|trace) [^\\n#]*)")

// documentedCommands are the commands of one doc that take --state, as
// argument lists with the doc's placeholders replaced by the checked-in
// upstream dump, its objects and a kubeadm config.conf for that cluster.
func documentedCommands(t *testing.T, doc string) [][]string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("../../docs", doc))
	if err != nil {
		t.Fatal(err)
	}
	conf := kubeadmConfigFor(t, docClusterCIDRs)
	replace := map[string]string{
		"v4.txt": docDumps + "/iptables-legacy-save.txt", "v6.txt": docDumps + "/ip6tables-legacy-save.txt",
		"state": docDumps + "/objects.json", "DIR": docDumps + "/objects.json", "NODE": "node-1",
		"CIDR": docClusterCIDRs, "config.conf": conf,
	}
	var out [][]string
	for _, m := range docCommand.FindAllStringSubmatch(string(text), -1) {
		cmd := m[1] + m[2] // a code span, or a line of a code block
		words := strings.Fields(cmd)
		if !strings.Contains(cmd, "--state") {
			continue
		}
		nft := strings.Contains(cmd, "--nft-ruleset")
		for i, w := range words[1:] {
			if r, ok := replace[w]; ok {
				words[i+1] = r
			}
			switch {
			case nft && w == "ruleset.txt":
				words[i+1] = docNFTDump + "/nft-ruleset.txt"
			case nft && (w == "state" || w == "DIR"):
				words[i+1] = docNFTDump + "/objects.json"
			}
		}
		out = append(out, words[1:])
	}
	return out
}

// kubeadmConfigFor is deploy/kubeadm's config.conf (kubeadm's own, mode
// iptables) for a cluster with these pod CIDRs.
func kubeadmConfigFor(t *testing.T, cidrs string) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubeadm/config.conf")
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`(?m)^clusterCIDR: .*$`).ReplaceAll(b, []byte("clusterCIDR: "+cidrs))
	p := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runCommand runs the binary's command line in process, returning its
// output and exit code as main would.
func runCommand(args []string) (string, int) {
	_ = logsapi.ResetForTest(nil)
	defer func() { _ = logsapi.ResetForTest(nil) }()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err := cmd.Execute()
	var ee *exitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.code
	}
	return out.String() + errOut.String() + err.Error(), 1
}

// The migration doc's diff commands, run as written on a real kube-proxy
// dump, say every Service port is equal (exit 0), as the doc promises:
// the commands assume the mode the proxy runs in by default, as kube-proxy
// (iptables), or the one kube-proxy's --config names.
func TestDocumentedDiffCommands(t *testing.T) {
	n := 0
	for _, doc := range []string{"migration.md", "debugging.md"} {
		for _, args := range documentedCommands(t, doc) {
			if args[0] != "diff" {
				continue
			}
			n++
			out, code := runCommand(args)
			if code != exitEqual || strings.Contains(out, ": different") {
				t.Errorf("%s: kube-nftproxy %s: exit %d, want 0 and every Service port equal:\n%s", doc, strings.Join(args, " "), code, out)
			}
			if !strings.HasPrefix(out, "mode: ") {
				t.Errorf("%s: kube-nftproxy %s: does not first say the mode it assumed:\n%s", doc, strings.Join(args, " "), out)
			}
		}
	}
	if n < 5 {
		t.Fatalf("found %d documented diff commands with --state, want at least 5 (migration.md step 2, its kubeadm form and from nftables mode, debugging.md's two)", n)
	}
}

// The documented trace of a node's own connection to a localhost NodePort
// is DNATed, as the proxy's default mode (iptables) serves it.
func TestDocumentedTraceCommands(t *testing.T) {
	n := 0
	for _, args := range documentedCommands(t, "debugging.md") {
		if args[0] != "trace" {
			continue
		}
		n++
		out, code := runCommand(args)
		if code != 0 || strings.Contains(out, "not DNATed") || !strings.Contains(out, "\nverdict: accept\n") {
			t.Errorf("kube-nftproxy %s: exit %d, want a DNATed accept:\n%s", strings.Join(args, " "), code, out)
		}
	}
	if n == 0 {
		t.Fatal("debugging.md shows no trace command with --state")
	}
}
