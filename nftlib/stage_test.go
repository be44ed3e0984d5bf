package nftlib

import (
	"slices"
	"strings"
	"testing"
)

// stageTable is releaseTable(n) with a base chain that jumps to
// KUBE-SERVICES and the KUBE-MARK-MASQ the fragments jump to.
func stageTable(n int) *Table {
	t := releaseTable(n)
	t.Comment = "rules for t"
	t.Chains = append([]*Chain{
		{Name: "nat-output", Hook: &Hook{Type: "nat", Hook: "output", Priority: -100}, Rules: []Rule{R(JumpTo("KUBE-SERVICES"))}},
		{Name: "KUBE-MARK-MASQ", Rules: []Rule{R(MarkSet{Bit: 0x4000})}},
	}, t.Chains...)
	return t
}

// script writes transactions as nft commands, one transaction a block.
func script(txs ...*Tx) string {
	var blocks []string
	var setID uint32
	for _, x := range txs {
		var sw scriptWriter
		x.Write(&sw, &setID)
		blocks = append(blocks, sw.B.String())
	}
	return strings.Join(blocks, "--\n")
}

// A full sync of a table the kernel lacks, staged: first the table, its
// map and its regular fixed chains, empty; then the fragments' chains with
// their rules, two fragments a transaction here; last, what makes them
// reachable: the base chain, the fixed chains' rules and the map's
// elements. Together they write what the one transaction writes.
func TestTxStage(t *testing.T) {
	x, _ := FullTx(stageTable(3), &KernelTable{}, false)
	whole := script(x)

	tb := stageTable(3)
	frags, keys := tb.Fragments, tb.fragmentKeys()
	tb.Fragments = map[string]*Fragment{}
	x, _ = FullTx(tb, &KernelTable{}, false)
	txs := []*Tx{x.StageFixed()}
	for lo := 0; lo < len(keys); lo += 2 {
		var chains []*Chain
		for _, k := range keys[lo:min(lo+2, len(keys))] {
			chains = append(chains, frags[k].Chains...)
			x.AddElements(frags[k].Elements)
		}
		txs = append(txs, ChainsTx(tb, chains))
	}
	got := script(append(txs, x)...)
	want := `add table ip t { comment "rules for t"; }
add map ip t m { type ipv4_addr : verdict; }
add chain ip t KUBE-MARK-MASQ
add chain ip t KUBE-SERVICES
--
add chain ip t KUBE-SVC-0000
add chain ip t KUBE-SVC-0001
add rule ip t KUBE-SVC-0000 ip saddr 10.96.0.0 jump KUBE-MARK-MASQ
add rule ip t KUBE-SVC-0000 dnat to 10.96.0.0:80
add rule ip t KUBE-SVC-0001 ip saddr 10.96.0.1 jump KUBE-MARK-MASQ
add rule ip t KUBE-SVC-0001 dnat to 10.96.0.1:80
--
add chain ip t KUBE-SVC-0002
add rule ip t KUBE-SVC-0002 ip saddr 10.96.0.2 jump KUBE-MARK-MASQ
add rule ip t KUBE-SVC-0002 dnat to 10.96.0.2:80
--
add table ip t { comment "rules for t"; }
add chain ip t nat-output { type nat hook output priority -100; policy accept; }
add rule ip t nat-output jump KUBE-SERVICES
add rule ip t KUBE-MARK-MASQ meta mark set meta mark | 0x00004000
add rule ip t KUBE-SERVICES ip daddr vmap @m
add element ip t m { 10.96.0.0 comment "ns/s:p" : goto KUBE-SVC-0000 }
add element ip t m { 10.96.0.1 comment "ns/s:p" : goto KUBE-SVC-0001 }
add element ip t m { 10.96.0.2 comment "ns/s:p" : goto KUBE-SVC-0002 }
`
	if got != want {
		t.Errorf("staged:\n%s\nwant\n%s", got, want)
	}
	if sortedLines(got) != sortedLines(whole) {
		t.Errorf("the staged transactions write\n%s\nthe one transaction\n%s", got, whole)
	}
}

// A table the kernel holds is rewritten in one transaction: flushed and
// filled again, never without its rules in between.
func TestTxStageExistingTable(t *testing.T) {
	x, _ := FullTx(stageTable(3), &KernelTable{Exists: true}, false)
	if x.Fresh() || x.StageFixed() != nil {
		t.Error("staged a full sync over an existing table")
	}
	if got, want := script(x), script(mustFullTx(stageTable(3), true)); got != want {
		t.Errorf("StageFixed changed a transaction over an existing table:\n%s\nwant\n%s", got, want)
	}
}

func mustFullTx(t *Table, exists bool) *Tx {
	x, _ := FullTx(t, &KernelTable{Exists: exists}, false)
	return x
}

// sortedLines is s's lines, sorted, without the separators and the
// repeated "add table".
func sortedLines(s string) string {
	seen := map[string]bool{}
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l == "--" || l == "" || seen[l] {
			continue
		}
		seen[l] = true
		out = append(out, l)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
