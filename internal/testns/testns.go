// Package testns gives kernel tests network namespaces of their own, and
// runs nft in them. Tests only: it skips the test where it cannot work.
package testns

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
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

// NFT runs `nft args...` in namespace ns and returns its output; it skips
// the test without the nft binary and fails it when nft fails.
func NFT(t testing.TB, ns string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary (package nftables) to read the ruleset back")
	}
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}
