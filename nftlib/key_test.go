package nftlib

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Keys go to the kernel's layout and back, and print as nft prints them:
// a single field unpadded, a concatenation padded to 4 bytes a field, a
// second address in Net, an interval set's prefix as its range.
func TestKeyLayout(t *testing.T) {
	addrPort := []Field{FieldDaddr, FieldL4Proto, FieldDport, FieldSaddr}
	for _, tc := range []struct {
		name string
		f    Family
		m    Map
		k    Key
		len  uint32
		text string
	}{
		{"a port", IPv4, Map{Key: []Field{FieldDport}, Plain: true}, Key{Port: 30053}, 2, "30053"},
		{"an address", IPv6, Map{Key: []Field{FieldDaddr}, Plain: true}, Key{Addr: netip.MustParseAddr("fd00::1")}, 16, "fd00::1"},
		{"address . port", IPv4, Map{Key: []Field{FieldDaddr, FieldDport}, Plain: true},
			Key{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80}, 8, "10.0.0.1 . 80"},
		{"two addresses", IPv4, Map{Key: addrPort, Plain: true},
			Key{Addr: netip.MustParseAddr("10.0.0.1"), Proto: unix.IPPROTO_TCP, Port: 80, Net: netip.MustParsePrefix("10.0.0.1/32")},
			16, "10.0.0.1 . tcp . 80 . 10.0.0.1"},
		{"a range", IPv6, Map{Key: addrPort, Plain: true, Interval: true},
			Key{Addr: netip.MustParseAddr("2001:db8::1"), Proto: unix.IPPROTO_UDP, Port: 53, Net: netip.MustParsePrefix("fd00:1::/48")},
			40, "2001:db8::1 . udp . 53 . fd00:1::/48"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &tc.m
			key := encodeKey(tc.f, m.Key, tc.k)
			if uint32(len(key)) != tc.len || keyLen(tc.f, m.Key) != tc.len {
				t.Errorf("key of %d bytes, declared %d; want %d", len(key), keyLen(tc.f, m.Key), tc.len)
			}
			var end []byte
			if m.Interval {
				end = appendKey(nil, tc.f, m.Key, tc.k, true)
			}
			got, err := m.decodeKey(tc.f, key, end)
			if err != nil || got != tc.k {
				t.Errorf("decoded %+v, %v; want %+v", got, err, tc.k)
			}
			if s := tc.k.text(m.Key); s != tc.text {
				t.Errorf("text %q, want %q", s, tc.text)
			}
		})
	}
}
