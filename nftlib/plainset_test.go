package nftlib

import (
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A Plain map is a named set: rendered, scripted and checked as one, its
// elements without verdicts.
func TestPlainSet(t *testing.T) {
	set := &Map{Name: "ips", Key: []Field{FieldDaddr}, Plain: true, Comment: "some IPs"}
	tbl := &Table{Family: IPv4, Name: "t", Maps: []*Map{set}, Chains: []*Chain{{Name: "c", Rules: []Rule{R(SetMatch{Field: FieldDaddr, Set: "ips"}, Reject{})}}},
		Fragments: map[string]*Fragment{
			"b": {Elements: []MapElement{{Map: "ips", Element: Element{Key: Key{Addr: netip.MustParseAddr("10.0.0.2")}, Comment: "ns/b"}}}},
			"a": {Elements: []MapElement{{Map: "ips", Element: Element{Key: Key{Addr: netip.MustParseAddr("10.0.0.10")}}}}},
			"c": {Elements: []MapElement{{Map: "ips", Element: Element{Key: Key{Addr: netip.MustParseAddr("10.0.0.1")}}}}},
		}}
	var b strings.Builder
	tbl.renderTo(&b)
	for _, want := range []string{
		"\tset ips {\n\t\ttype ipv4_addr\n\t\tcomment \"some IPs\"\n",
		// sorted by address, two to a line, as nft lists them
		"elements = { 10.0.0.1, 10.0.0.2 comment \"ns/b\",\n\t\t\t     10.0.0.10 }\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("render lacks %q:\n%s", want, b.String())
		}
	}

	var s scriptWriter
	s.addMap(IPv4, "t", set, 1)
	s.flushMap(IPv4, "t", set)
	s.Elements(true, IPv4, "t", set, []Element{{Key: Key{Addr: netip.MustParseAddr("10.0.0.2")}, Comment: "ns/b"}})
	s.Elements(false, IPv4, "t", set, []Element{{Key: Key{Addr: netip.MustParseAddr("10.0.0.2")}}})
	want := `add set ip t ips { type ipv4_addr; }
flush set ip t ips
add element ip t ips { 10.0.0.2 comment "ns/b" }
delete element ip t ips { 10.0.0.2 }
`
	if s.B.String() != want {
		t.Errorf("script\n%s\nwant\n%s", s.B.String(), want)
	}

	for _, tc := range []struct {
		name string
		ks   kernelSet
		ok   bool
	}{
		{"a plain set", kernelSet{KeyType: concatType(IPv4, set.Key), KeyLen: keyLen(IPv4, set.Key), Udata: commentUdata(SetCommentType, set.Comment)}, true},
		{"a verdict map", kernelSet{Flags: unix.NFT_SET_MAP, KeyType: concatType(IPv4, set.Key), KeyLen: keyLen(IPv4, set.Key), DataType: VerdictType,
			Udata: commentUdata(SetCommentType, set.Comment)}, false},
	} {
		if got := mapMismatch(IPv4, &tc.ks, set); (got == "") != tc.ok {
			t.Errorf("%s: mismatch %q, want none: %v", tc.name, got, tc.ok)
		}
	}
}
