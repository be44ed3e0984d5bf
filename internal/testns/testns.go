// Package testns gives kernel tests network namespaces of their own, and
// runs nft in them. Tests only: it skips the test where it cannot work.
package testns

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// New creates a network namespace named prefix + 8 random hex digits for
// one test and deletes it when the test ends. It skips the test without
// root or iproute2's ip.
func New(t testing.TB, prefix string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace (run as root: make test)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to create network namespaces")
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := prefix + hex.EncodeToString(suffix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// Path is the path of namespace ns, for what opens sockets in it.
func Path(ns string) string { return "/run/netns/" + ns }

// NFT runs `nft args...` in namespace ns and returns its output; it skips
// the test without the nft binary and fails it when nft fails.
func NFT(t testing.TB, ns string, args ...string) string {
	t.Helper()
	return nft(t, ns, "", args...)
}

// NFTScript loads an nft script (nft -f -) in namespace ns; it skips the
// test without the nft binary and fails it when nft fails.
func NFTScript(t testing.TB, ns, script string) {
	t.Helper()
	nft(t, ns, script, "-f", "-")
}

func nft(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary (package nftables)")
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}
