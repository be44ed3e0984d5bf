package nftlib

import (
	"encoding/binary"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// The objects each probed feature writes into the scratch table: the terms
// and chains a caller's tables use, each in a base chain of a hook where
// they run (some expressions accept only certain hooks or chain types).

var (
	probeNATPrerouting  = Hook{Type: "nat", Hook: "prerouting", Priority: -100}
	probeNATPostrouting = Hook{Type: "nat", Hook: "postrouting", Priority: 100}
	probeFilterInput    = Hook{Type: "filter", Hook: "input", Priority: 0}
)

// probeAddr is an address of the family for keys and DNAT targets.
func probeAddr(f Family) netip.Addr {
	if f == IPv6 {
		return netip.MustParseAddr("fd00::1")
	}
	return netip.MustParseAddr("10.0.0.1")
}

// probeRule adds a base chain "probe" on hook h with one rule of terms.
func probeRule(b *batch, f Family, table string, h Hook, terms ...Term) {
	b.AddChain(f, table, &Chain{Name: "probe", Hook: &h})
	b.AddRule(f, table, "probe", R(terms...))
}

// probeTerms probes terms in a nat prerouting chain, where DNAT rules
// run.
func probeTerms(terms ...Term) func(b *batch, f Family, table string) {
	return func(b *batch, f Family, table string) {
		probeRule(b, f, table, probeNATPrerouting, terms...)
	}
}

func probeBaseChains(b *batch, f Family, table string) {
	for i, h := range []Hook{probeNATPrerouting, probeNATPostrouting,
		{Type: "nat", Hook: "output", Priority: -100}, {Type: "filter", Hook: "prerouting", Priority: -110},
		probeFilterInput, {Type: "filter", Hook: "forward", Priority: 0}, {Type: "filter", Hook: "output", Priority: 0}} {
		b.AddChain(f, table, &Chain{Name: "probe-" + string(rune('a'+i)), Hook: &h})
	}
}

func probeVmap(b *batch, f Family, table string) {
	m := &Map{Name: "probe-vmap", Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}}
	b.addMap(f, table, m, 1)
	b.Elements(true, f, table, m, []Element{{Key: Key{Addr: probeAddr(f), Proto: unix.IPPROTO_TCP, Port: 80},
		Verdict: Verdict{Kind: Accept}, Comment: probeComment}})
	probeRule(b, f, table, probeNATPrerouting, Vmap(m.Name, m.Key...))
}

func probeDNAT(b *batch, f Family, table string) {
	probeRule(b, f, table, probeNATPrerouting, ProtoMatch{Proto: unix.IPPROTO_TCP}, DNAT{Addr: probeAddr(f), Port: 8080})
}

func probeMasquerade(b *batch, f Family, table string) {
	probeRule(b, f, table, probeNATPostrouting, MarkZero{Bit: 0x4000}, Masquerade{})
}

func probeReject(b *batch, f Family, table string) {
	probeRule(b, f, table, probeFilterInput, ProtoMatch{Proto: unix.IPPROTO_TCP}, Reject{})
}

func probeSticky(b *batch, f Family, table string) {
	const set = "probe-sticky"
	b.addStickySet(f, table, set, probeComment, 1)
	probeRule(b, f, table, probeNATPrerouting,
		StickyMatch{Set: set, ID: 1}, StickyUpdate{Set: set, ID: 1, Timeout: 3 * time.Hour})
}

func probeIntervalConcat(b *batch, f Family, table string) {
	key := []Field{FieldDaddr, FieldL4Proto, FieldDport, FieldSaddr}
	m := &Map{Name: "probe-interval", Key: key, Plain: true, Interval: true, Comment: probeComment}
	b.addMap(f, table, m, 1)
	src := netip.PrefixFrom(probeAddr(f), probeAddr(f).BitLen()-8).Masked()
	b.Elements(true, f, table, m, []Element{{Key: Key{Addr: probeAddr(f), Proto: unix.IPPROTO_TCP, Port: 80, Net: src}}})
	probeRule(b, f, table, probeFilterInput, LookupSet(m.Name, key...), Verdict{Kind: Accept})
}

// probeChainComment adds a commented chain whose creation the kernel echoes.
func probeChainComment(b *batch, f Family, table string) {
	b.AddChain(f, table, &Chain{Name: "probe-comment", Comment: probeComment})
	b.echoLast()
}

// echoLast asks the kernel to echo the message just written (NLM_F_ECHO).
func (b *batch) echoLast() {
	flags := binary.NativeEndian.Uint16(b.Buf[b.start+6:])
	binary.NativeEndian.PutUint16(b.Buf[b.start+6:], flags|unix.NLM_F_ECHO)
}
