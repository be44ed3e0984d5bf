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
