package nftlib

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Each family is spelled as nft spells it; ip holds IPv4 addresses, ip6
// IPv6 ones.
func TestFamily(t *testing.T) {
	for f, name := range map[Family]string{IPv4: "ip", IPv6: "ip6", unix.NFPROTO_INET: "inet",
		unix.NFPROTO_ARP: "arp", unix.NFPROTO_BRIDGE: "bridge", unix.NFPROTO_NETDEV: "netdev"} {
		if got := f.String(); got != name {
			t.Errorf("family %d is %q, want %q", f, got, name)
		}
	}
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	if !IPv4.Has(v4) || IPv4.Has(v6) || IPv6.Has(v4) || !IPv6.Has(v6) {
		t.Errorf("ip has 10.0.0.1 %v, fd00::1 %v; ip6 has 10.0.0.1 %v, fd00::1 %v", IPv4.Has(v4), IPv4.Has(v6), IPv6.Has(v4), IPv6.Has(v6))
	}
}

// A target's sticky id is the first four bytes of the SHA-256 of its
// chain's name, so the same after a restart, and written into the rules
// that match and update the sticky set.
func TestStickyID(t *testing.T) {
	for _, tc := range []struct {
		chain string
		id    uint32
	}{
		{"a", 0xca978112}, // sha256("a") = ca978112ca1bbdca...
		{"b", 0x3e23e816}, // sha256("b") = 3e23e8160039594a...
	} {
		if got := StickyID(tc.chain); got != tc.id {
			t.Errorf("StickyID(%q) = %#x, want %#x", tc.chain, got, tc.id)
		}
	}
	r := R(StickyMatch{Set: "sticky", ID: StickyID("a")}, GotoChain("a"))
	if got, want := r.Text(IPv4), "ip saddr . numgen random mod 1 offset 3398926610 @sticky goto a"; got != want {
		t.Errorf("the rule reads %q, want %q", got, want)
	}
}
