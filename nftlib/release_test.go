package nftlib

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
)

// releaseTable is a table with a fixed chain, a map and n fragments of
// one chain of two rules and one element each.
func releaseTable(n int) *Table {
	t := &Table{Family: IPv4, Name: "t", Fragments: map[string]*Fragment{},
		Maps:   []*Map{{Name: "m", Key: []Field{FieldDaddr}}},
		Chains: []*Chain{{Name: "KUBE-SERVICES", Rules: []Rule{R(Vmap("m", FieldDaddr))}}}}
	for i := range n {
		name := fmt.Sprintf("KUBE-SVC-%04d", i)
		addr := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		t.Fragments[name] = &Fragment{
			Chains: []*Chain{{Name: name, Comment: "ns/s:p", Rules: []Rule{
				R(AddrMatch{Field: FieldSaddr, Prefix: netip.PrefixFrom(addr, 32)}, JumpTo("KUBE-MARK-MASQ")),
				R(DNAT{Addr: addr, Port: 80}),
			}}},
			Elements: []MapElement{{Map: "m", Element: Element{Key: Key{Addr: addr}, Verdict: GotoChain(name), Comment: "ns/s:p"}}},
		}
	}
	return t
}

// A transaction that lets go of its fragments as it writes them writes the
// same bytes, calls back after every round, and leaves the table its fixed
// parts only.
func TestTxReleaseRules(t *testing.T) {
	encode := func(t *Table, round int, between func()) []byte {
		x, _ := FullTx(t, &KernelTable{}, false)
		if between != nil {
			x.ReleaseRules(round, between)
		}
		b := newBatch(1)
		var setID uint32
		x.Write(b, &setID)
		chunks, _, err := b.finish()
		if err != nil {
			panic(err)
		}
		return bytes.Join(chunks, nil)
	}
	want := encode(releaseTable(10), 0, nil)
	tb := releaseTable(10)
	rounds := 0
	got := encode(tb, 5, func() { rounds++ })
	if !bytes.Equal(got, want) {
		t.Errorf("released: %d bytes differ from the batch written whole (%d bytes)", len(got), len(want))
	}
	// 11 chains of 21 rules (KUBE-SERVICES' and two a fragment), whole
	// chains to a round until it has five rules or more: 3+3+3+2 chains,
	// and the last round is not a full one.
	if rounds != 3 {
		t.Errorf("%d calls, want 3", rounds)
	}
	if tb.Fragments != nil || len(tb.Chains[0].Rules) != 1 {
		t.Errorf("after the write the table holds %d fragments and %d fixed rules, want none and 1", len(tb.Fragments), len(tb.Chains[0].Rules))
	}
}
