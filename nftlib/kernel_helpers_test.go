package nftlib

import (
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// openTestKernel opens a Kernel in namespace ns, closed with the test.
func openTestKernel(t testing.TB, ns string) *Kernel {
	t.Helper()
	k, err := OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
