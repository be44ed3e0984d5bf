package nftlib

import "slices"

// Stage splits a transaction that creates its table into several, so
// that a large full sync's chains can be encoded while the kernel takes
// the ones before them, rather than all of them while it waits.
//
// The transactions it returns, to commit in order before x, create the
// table, its sets and its regular fixed chains, empty, and then the
// fragments' chains with their rules, about pieceRules rules each. None
// of them changes what a packet meets: the table has no base chain and
// its maps no element until x commits, and x, left with the base chains,
// the fixed chains' rules and the maps' elements, is what makes the rest
// reachable, in one step. A fragment's rules refer only to its own
// chains, the fixed ones and the table's sets, all created by then.
//
// For a table the kernel holds already, whose rewrite must stay one
// transaction, it returns nil and leaves x as it was. Like ReleaseRules,
// only for a table whose fragments are not used again: x's table no
// longer lists them, and the returned transactions hold the only
// references to their chains.
func (x *Tx) Stage(pieceRules int) []*Tx {
	t := x.table
	fixed := len(t.Chains)
	if !x.fresh || x.delTable || len(x.rules) <= fixed || len(x.newChains) != len(x.rules) {
		return nil
	}
	first := &Tx{f: x.f, table: t, newTable: true, newMaps: x.newMaps, newAffinity: x.newAffinity}
	var base []*Chain
	for _, c := range x.rules[:fixed] {
		if c.Hook != nil {
			base = append(base, c)
		} else {
			first.newChains = append(first.newChains, c)
		}
	}
	pieces := []*Tx{first}
	frags := x.rules[fixed:]
	for lo := 0; lo < len(frags); {
		hi, n := lo, 0
		for hi < len(frags) && n < pieceRules {
			n += len(frags[hi].Rules)
			hi++
		}
		chains := slices.Clone(frags[lo:hi])
		pieces = append(pieces, &Tx{f: x.f, table: t, newChains: chains, rules: chains})
		lo = hi
	}
	cloneElementStrings(x.addElems)
	t.Fragments = nil
	x.newMaps, x.newAffinity, x.newChains, x.rules = nil, false, base, slices.Clone(x.rules[:fixed])
	return pieces
}
