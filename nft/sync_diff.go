package nft

import "github.com/kube-nftproxy/kube-nftproxy/nftlib"

// syncDiff is one sync's transaction, per table, and what it leaves for
// later: the chains it flushes (stale) and the older flushed ones not due
// yet (kept), to delete once staleChainAge has passed.
type syncDiff struct {
	txs         []*nftlib.Tx // in tableIDs order
	stale, kept map[tableID][]string
	deleted     int // stale chains it deletes
}

// diff turns a plan into table transactions: a full plan against what the
// kernel holds (read first), any other against the applied tables, at the
// service ports the plan names.
func (b *Backend) diff(p *syncPlan, ph *syncPhases) (*syncDiff, error) {
	var kts map[tableID]*nftlib.KernelTable
	if p.full {
		var err error
		if kts, err = b.readKernel(p.want); err != nil {
			return nil, err
		}
		ph.read = ph.lap()
	}
	d := &syncDiff{stale: map[tableID][]string{}, kept: map[tableID][]string{}}
	keys := append(fragmentKeys(p.names), p.extraKeys...)
	for _, id := range tableIDs() {
		var x *nftlib.Tx
		if p.full {
			x, d.stale[id] = nftlib.FullTx(p.want[id], kts[id], b.replace[id])
		} else {
			x, d.stale[id] = nftlib.DiffTx(p.have[id], p.want[id], keys)
			d.kept[id] = deleteDueChains(x, p.have[id], p.want[id], keys, b.stale.pending[id], b.stale.due(id, p.now))
		}
		d.deleted += len(x.DelChains)
		d.txs = append(d.txs, x)
	}
	return d, nil
}

// readKernel reads what the kernel holds of the given tables (see
// readKernel).
func (b *Backend) readKernel(tables map[tableID]*nftlib.Table) (map[tableID]*nftlib.KernelTable, error) {
	return readKernel(b.k, tables, b.stale.pending)
}

// readKernel reads what the kernel holds of the given tables (their
// metadata, not rules or elements), and refuses tables another process
// owns. pending are the stale chains each table may still hold.
func readKernel(k nftlib.Dataplane, tables map[tableID]*nftlib.Table, pending map[tableID][]string) (map[tableID]*nftlib.KernelTable, error) {
	out := make(map[tableID]*nftlib.KernelTable, len(tables))
	me := k.PortID()
	for _, f := range nftlib.Families {
		names, expect := expectedChains(f, tables, pending)
		if len(names) == 0 {
			continue
		}
		kts, err := k.ReadFamily(f, names, expect)
		if err != nil {
			return nil, err
		}
		for _, id := range tableIDs() {
			if id.f != f || tables[id] == nil {
				continue
			}
			kt := kts[tables[id].Name]
			if kt.Exists && kt.Flags&nftlib.NftTableFOwner != 0 && kt.Owner != me {
				return nil, &nftlib.TableOwnedError{Family: f, Table: tables[id].Name, Owner: kt.Owner}
			}
			out[id] = kt
		}
	}
	return out, nil
}

// expectedChains lists the tables of family f and the chains each should
// hold: ours, and those flushed for deletion that may remain.
func expectedChains(f nftlib.Family, tables map[tableID]*nftlib.Table, pending map[tableID][]string) ([]string, map[string][]string) {
	var names []string
	expect := map[string][]string{}
	for _, id := range tableIDs() {
		if t := tables[id]; id.f == f && t != nil {
			names = append(names, t.Name)
			want := make([]string, 0, t.ChainCount()+len(pending[id]))
			t.EachChain(func(c *nftlib.Chain) { want = append(want, c.Name) })
			expect[t.Name] = append(want, pending[id]...)
		}
	}
	return names, expect
}
