package nftlib

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// diffTable is what the DiffTx cases start from, with edit applied (nil:
// none); each call builds it anew, so that cases share no pointers:
//
//	table ip t {
//		map m { type ipv4_addr : verdict; elements = { 10.0.0.1 : goto a } }
//		chain in { type filter hook input priority filter; ip daddr vmap @m }
//		chain a { accept }
//		# fragment x: chain x { drop }, m: 10.0.0.2 : goto x
//		# fragment y: chain y { return }, m: 10.0.0.3 : goto y
//	}
func diffTable(edit func(t *Table)) *Table {
	elem := func(addr, chain string) Element {
		return Element{Key: Key{Addr: netip.MustParseAddr(addr)}, Verdict: GotoChain(chain)}
	}
	fragment := func(chain, addr string, v VerdictKind) *Fragment {
		return &Fragment{Chains: []*Chain{{Name: chain, Rules: []Rule{R(Verdict{Kind: v})}}},
			Elements: []MapElement{{Map: "m", Element: elem(addr, chain)}}}
	}
	t := &Table{Family: IPv4, Name: "t",
		Maps: []*Map{{Name: "m", Key: []Field{FieldDaddr}, Elements: []Element{elem("10.0.0.1", "a")}}},
		Chains: []*Chain{
			{Name: "in", Hook: &Hook{Type: "filter", Hook: "input"}, Rules: []Rule{R(Vmap("m", FieldDaddr))}},
			{Name: "a", Rules: []Rule{R(Verdict{Kind: Accept})}},
		},
		Fragments: map[string]*Fragment{"x": fragment("x", "10.0.0.2", Drop), "y": fragment("y", "10.0.0.3", Return)}}
	if edit != nil {
		edit(t)
	}
	return t
}

// diffCase is one change from diffTable(nil) to diffTable(edit).
type diffCase struct {
	name   string
	edit   func(t *Table)
	keys   []string // the fragments DiffTx looks at
	script string   // Tx.Script of the transaction
	stale  string   // the chains it leaves to delete later
}

func diffCases() []diffCase {
	addElem := func(m, addr, chain string) func(t *Table) {
		return func(t *Table) {
			t.Map(m).Elements = append(t.Map(m).Elements, Element{Key: Key{Addr: netip.MustParseAddr(addr)}, Verdict: GotoChain(chain)})
		}
	}
	return []diffCase{
		{name: "nothing changed", keys: []string{"x", "y"}},
		{name: "a rule added to a fixed chain", edit: func(t *Table) {
			t.Chain("a").Rules = append(t.Chain("a").Rules, R(Verdict{Kind: Drop}))
		}, script: `flush chain ip t a
add rule ip t a accept
add rule ip t a drop
`},
		{name: "a rule's comment changed", edit: func(t *Table) { t.Chain("a").Rules[0].Comment = "now" }, script: `flush chain ip t a
add rule ip t a accept comment "now"
`},
		{name: "a fixed chain added, an element goes to it", edit: func(t *Table) {
			t.Chains = append(t.Chains, &Chain{Name: "b", Rules: []Rule{R(JumpTo("a"))}})
			addElem("m", "10.0.0.9", "b")(t)
		}, script: `add chain ip t b
add rule ip t b jump a
add element ip t m { 10.0.0.9 : goto b }
`},
		{name: "an element's verdict changed", edit: func(t *Table) { t.Map("m").Elements[0].Verdict = GotoChain("x") }, script: `delete element ip t m { 10.0.0.1 }
add element ip t m { 10.0.0.1 : goto x }
`},
		{name: "an element's comment changed", edit: func(t *Table) { t.Map("m").Elements[0].Comment = "now" }, script: `delete element ip t m { 10.0.0.1 }
add element ip t m { 10.0.0.1 comment "now" : goto a }
`},
		{name: "the fixed chain a and its element removed", edit: func(t *Table) {
			t.Chains, t.Map("m").Elements = t.Chains[:1], nil
		}, script: `delete element ip t m { 10.0.0.1 }
flush chain ip t a
`, stale: "a"},
		{name: "a map added", edit: func(t *Table) {
			t.Maps = append(t.Maps, &Map{Name: "n", Key: []Field{FieldSaddr}})
			addElem("n", "10.0.0.4", "a")(t)
		}, script: `add map ip t n { type ipv4_addr : verdict; }
add element ip t n { 10.0.0.4 : goto a }
`},
		{name: "the sticky set added", edit: func(t *Table) { t.Sticky, t.StickyComment = "sticky", "sources" },
			script: "add set ip t sticky { typeof ip saddr . numgen random mod 1; size 1048576; flags dynamic,timeout; }\n"},
		{name: "fragment x changed", edit: func(t *Table) { t.Fragments["x"].Chains[0].Rules[0] = R(Verdict{Kind: Accept}) },
			keys: []string{"x"}, script: `flush chain ip t x
add rule ip t x accept
`},
		{name: "fragment x removed", edit: func(t *Table) { delete(t.Fragments, "x") }, keys: []string{"x"}, script: `delete element ip t m { 10.0.0.2 }
flush chain ip t x
`, stale: "x"},
		{name: "fragment z added", edit: func(t *Table) {
			t.Fragments["z"] = &Fragment{Chains: []*Chain{{Name: "z", Rules: []Rule{R(JumpTo("a"))}}},
				Elements: []MapElement{{Map: "m", Element: Element{Key: Key{Addr: netip.MustParseAddr("10.0.0.26")}, Verdict: JumpTo("z")}}}}
		}, keys: []string{"z"}, script: `add chain ip t z
add rule ip t z jump a
add element ip t m { 10.0.0.26 : jump z }
`},
		{name: "fragment y's chain renamed", edit: func(t *Table) {
			fr := t.Fragments["y"]
			fr.Chains[0].Name, fr.Elements[0].Verdict = "y2", GotoChain("y2")
		}, keys: []string{"y"}, script: `add chain ip t y2
delete element ip t m { 10.0.0.3 }
flush chain ip t y
add rule ip t y2 return
add element ip t m { 10.0.0.3 : goto y2 }
`, stale: "y"},
	}
}

// DiffTx writes only what changed, in the order the kernel needs
// (objects before what refers to them, references dropped before
// chains are left to delete), and names the chains it flushed.
func TestDiffTx(t *testing.T) {
	for _, tc := range diffCases() {
		t.Run(tc.name, func(t *testing.T) {
			x, stale := DiffTx(diffTable(nil), diffTable(tc.edit), tc.keys)
			var id uint32
			if got := x.Script(&id); got != tc.script {
				t.Errorf("script:\n%s\nwant:\n%s", got, tc.script)
			}
			if got := strings.Join(stale, " "); got != tc.stale {
				t.Errorf("stale %q, want %q", got, tc.stale)
			}
			if x.Empty() != (tc.script == "") {
				t.Errorf("Empty() = %v for script %q", x.Empty(), tc.script)
			}
			if got, want := x.Rules(), strings.Count(tc.script, "add rule "); got != want {
				t.Errorf("Rules() = %d, want %d", got, want)
			}
		})
	}
}

// DiffTx looks at the fragments keys names alone, and at nothing when
// both tables are the same value: the caller knows the others equal.
func TestDiffTxOnlyKeys(t *testing.T) {
	have := diffTable(nil)
	want := diffTable(func(t *Table) { t.Fragments["x"].Chains[0].Rules = nil })
	for _, tc := range []struct {
		name       string
		have, want *Table
		keys       []string
		empty      bool
	}{
		{"fragment x changed, keys name y", have, want, []string{"y"}, true},
		{"fragment x changed, keys name x", have, want, []string{"x"}, false},
		{"the same table, every key", have, have, []string{"x", "y"}, true},
		{"a key neither table has", have, diffTable(nil), []string{"nope"}, true},
	} {
		if x, _ := DiffTx(tc.have, tc.want, tc.keys); x.Empty() != tc.empty {
			var id uint32
			t.Errorf("%s: Empty() = %v, want %v; script:\n%s", tc.name, x.Empty(), tc.empty, x.Script(&id))
		}
	}
}

// commitTxs writes the transactions into one transaction of d and
// commits it.
func commitTxs(t *testing.T, d Dataplane, xs ...*Tx) {
	t.Helper()
	tx := d.NewTx()
	var setID uint32
	for _, x := range xs {
		x.Write(tx, &setID)
	}
	if err := d.CommitTx(tx); err != nil {
		t.Fatalf("committing:\n%s\n%v", script(xs...), err)
	}
}

// checkNoDrift reads want's table back from d and fails the test when
// TableDrift finds a difference (stale chains may remain).
func checkNoDrift(t *testing.T, d Dataplane, want *Table, stale []string) {
	t.Helper()
	kts, err := d.ReadFamily(want.Family, []string{want.Name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := d.TableDrift(want, kts[want.Name], stale)
	if err != nil || len(diffs) > 0 {
		t.Errorf("after the transaction, the table differs from what is wanted: %q, %v", diffs, err)
	}
}

// runDiffCase programs diffTable(nil) whole into d, then the case's
// DiffTx, then deletes the chains it left stale: each step leaves d
// holding what is wanted.
func runDiffCase(t *testing.T, d Dataplane, tc diffCase) {
	have, want := diffTable(nil), diffTable(tc.edit)
	full, _ := FullTx(have, &KernelTable{}, false)
	commitTxs(t, d, full)
	checkNoDrift(t, d, have, nil)
	x, stale := DiffTx(have, want, tc.keys)
	commitTxs(t, d, x)
	checkNoDrift(t, d, want, stale)
	if len(stale) == 0 {
		return
	}
	next, _ := DiffTx(want, want, nil)
	next.DelChains = stale
	commitTxs(t, d, next)
	checkNoDrift(t, d, want, nil)
	kts, err := d.ReadFamily(want.Family, []string{want.Name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range stale {
		if kts[want.Name].Chains[c] != nil {
			t.Errorf("stale chain %s is still there", c)
		}
	}
}

// Each DiffTx case takes the FakeKernel from the old table to the new one
// (TestKernelDiffTxApplies runs the same on the kernel).
func TestFakeKernelDiffTxApplies(t *testing.T) {
	for _, tc := range diffCases() {
		t.Run(tc.name, func(t *testing.T) { runDiffCase(t, NewFakeKernel(), tc) })
	}
}

// Each DiffTx case takes the kernel from the old table to the new one.
func TestKernelDiffTxApplies(t *testing.T) {
	for _, tc := range diffCases() {
		t.Run(tc.name, func(t *testing.T) {
			runDiffCase(t, openTestKernel(t, testns.New(t, "knp-nft-")), tc)
		})
	}
}
