package netns_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// AddrsExcept returns the addresses of every interface but the skipped
// ones, whose (many) addresses it does not read: the kernel filters.
func TestKernelAddrsExcept(t *testing.T) {
	ns := testns.New(t, "knp-addrs-")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "set", "lo", "up")
	ip("link", "add", "eth0", "type", "veth", "peer", "name", "vips")
	ip("link", "set", "eth0", "up")
	ip("addr", "add", "192.168.7.2/24", "dev", "eth0")
	ip("addr", "add", "10.1.2.3", "peer", "10.1.2.4", "dev", "eth0") // point-to-point: the local one counts
	ip("addr", "add", "fd00:7::2/64", "dev", "eth0", "nodad")
	for i := range 300 {
		ip("addr", "add", fmt.Sprintf("10.96.%d.%d/32", i/250, i%250+1), "dev", "vips")
	}
	var got []netip.Addr
	if err := netns.Do("/run/netns/"+ns, func() error {
		var err error
		got, err = netns.AddrsExcept("vips")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.7.2"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("fd00:7::2")}
	// The kernel adds an IPv6 link-local address to eth0 once it is up.
	got = slices.DeleteFunc(got, netip.Addr.IsLinkLocalUnicast)
	if !slices.Equal(got, want) {
		t.Errorf("AddrsExcept(vips) = %v, want %v", got, want)
	}
}

// AddrCache reads again after an address of a followed interface changes,
// and not after the skipped interface's change.
func TestKernelAddrCache(t *testing.T) {
	ns := testns.New(t, "knp-addrc-")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "add", "eth0", "type", "veth", "peer", "name", "vips")
	ip("addr", "add", "192.168.7.2/24", "dev", "eth0")
	err := netns.Do("/run/netns/"+ns, func() error {
		c, err := netns.NewAddrCache("vips")
		if err != nil {
			return err
		}
		defer c.Close()
		has := func(want string) bool {
			got, err := c.Addrs()
			if err != nil {
				t.Fatal(err)
			}
			return slices.Contains(got, netip.MustParseAddr(want))
		}
		if !has("192.168.7.2") {
			t.Error("first read misses 192.168.7.2")
		}
		ip("addr", "add", "10.96.0.1/32", "dev", "vips")
		if has("10.96.0.1") {
			t.Error("the skipped interface's address is listed")
		}
		ip("addr", "add", "192.168.8.2/24", "dev", "eth0")
		if !has("192.168.8.2") {
			t.Error("a new address of eth0 is not seen")
		}
		ip("addr", "del", "192.168.7.2/24", "dev", "eth0")
		if has("192.168.7.2") {
			t.Error("a deleted address of eth0 is still listed")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
