// Package vmguest tells tests whether they run inside the VM test tier
// (hack/vm: Debian's 6.1 kernel under QEMU, with IPVS, dummy links and
// modules) and lets kernel tests that need IPVS say so.
package vmguest

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

// Env is set to "1" by the VM tier's guest script for every test binary.
const Env = "KNP_VM_GUEST"

// IPVSProc exists exactly when the running kernel has IPVS. moby/ipvs and
// friends "work" without it (their calls succeed and do nothing), so this
// file is the check.
const IPVSProc = "/proc/net/ip_vs"

// InGuest reports whether the test binary runs in the VM tier's guest.
func InGuest() bool { return os.Getenv(Env) == "1" }

// HaveIPVS reports whether the running kernel has IPVS.
func HaveIPVS() (bool, error) {
	_, err := os.Stat(IPVSProc)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// RequireIPVS skips t when the kernel has no IPVS (this machine's kernel
// has none: run the test with hack/vm/run.sh), except in the VM guest,
// which promises IPVS: there its absence fails t.
func RequireIPVS(t testing.TB) {
	t.Helper()
	ok, err := HaveIPVS()
	if err != nil {
		t.Fatalf("checking for IPVS: %v", err)
	}
	if ok {
		return
	}
	if InGuest() {
		t.Fatalf("no %s in the VM guest: the ip_vs module did not load (see hack/vm/prepare.sh's module list)", IPVSProc)
	}
	t.Skipf("the kernel has no IPVS (no %s); run this test in the VM tier: hack/vm/run.sh", IPVSProc)
}
