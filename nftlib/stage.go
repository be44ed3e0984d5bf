package nftlib

// A full sync into tables the kernel does not hold yet can be staged, so
// that the chains of a large one are built and encoded while the kernel
// takes the ones before them, rather than all of them while it waits:
//
//  1. StageFixed splits off a transaction that creates the table, its sets
//     and its regular fixed chains, empty;
//  2. transactions of their own (ChainsTx) add the fragments' chains with
//     their rules, and their elements go to x (AddElements);
//  3. x, left with the base chains, the fixed chains' rules and the maps'
//     elements, commits last.
//
// None of the staged transactions changes what a packet meets: the table
// has no base chain and its maps no element until x commits, and x makes
// the rest reachable in one step. A fragment's rules refer only to its own
// chains, the fixed ones and the table's sets, all created by then.

// Fresh reports whether the transaction creates its table: the kernel
// holds none by that name (see StageFixed).
func (x *Tx) Fresh() bool { return x.fresh && !x.delTable }

// StageFixed splits off, from a transaction that creates its table (see
// Fresh), one that creates the table, its sets and its regular chains,
// empty, to commit before the staged chains; x keeps what makes them
// reachable. It returns nil, leaving x as it was, for a table the kernel
// holds, whose rewrite must stay one transaction.
func (x *Tx) StageFixed() *Tx {
	if !x.Fresh() || len(x.newChains) != len(x.rules) {
		return nil
	}
	first := &Tx{f: x.f, table: x.table, newTable: true, newMaps: x.newMaps, newSticky: x.newSticky}
	var base []*Chain
	for _, c := range x.newChains {
		if c.Hook != nil {
			base = append(base, c)
		} else {
			first.newChains = append(first.newChains, c)
		}
	}
	x.newMaps, x.newSticky, x.newChains = nil, false, base
	return first
}

// ChainsTx is a transaction that adds chains, with their rules, to t,
// whose table and fixed chains the kernel holds (see StageFixed).
func ChainsTx(t *Table, chains []*Chain) *Tx {
	return &Tx{f: t.Family, table: t, newChains: chains, rules: chains}
}

// AddElements adds staged fragments' elements to x, in order after those
// it holds, with strings of their own: sharing the fragments' memory,
// they would keep it in use after the fragments are encoded.
func (x *Tx) AddElements(elems []MapElement) {
	for _, e := range elems {
		x.addElems[e.Map] = append(x.addElems[e.Map], e.withOwnStrings())
	}
}
