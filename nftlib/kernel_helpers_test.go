package nftlib

import (
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// testNetns is a fresh network namespace for a kernel test (it skips
// without privileges).
func testNetns(t testing.TB) string {
	t.Helper()
	return testns.New(t, "knp-nft-")
}

// openTestKernel opens a Kernel in namespace ns, closed with the test.
func openTestKernel(t testing.TB, ns string) *Kernel {
	t.Helper()
	k, err := OpenKernel("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
