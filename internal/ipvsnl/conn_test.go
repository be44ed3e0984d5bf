package ipvsnl

import (
	"errors"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// On a kernel without IPVS (this machine's), Dial says so instead of
// returning a Conn whose calls would fail later or, as moby/ipvs does,
// succeed without effect.
func TestDialWithoutIPVS(t *testing.T) {
	if ok, err := vmguest.HaveIPVS(); err != nil || ok {
		t.Skipf("the kernel has IPVS (%v): nothing to check here", err)
	}
	c, err := Dial("")
	if err == nil {
		c.Close()
		t.Fatal("Dial on a kernel without IPVS succeeded")
	}
	if !errors.Is(err, ErrNoIPVS) {
		t.Fatalf("Dial: %v, want ErrNoIPVS", err)
	}
}
