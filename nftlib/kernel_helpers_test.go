package nftlib

import (
	"testing"
)

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
