package nft

import (
	"iter"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// A full sync into tables the kernel does not hold yet (a node's first
// start) that writes Strategy.StageRules*2 rules or more is staged (see
// nftlib.StageFixed): the plan builds the tables' fixed parts only, and a
// goroutine builds and encodes the Service ports' chains, about
// Strategy.StagePieces transactions of them, each while the kernel commits the one
// before; their elements and what makes them reachable go in the last
// transaction. Only the first piece's build and encoding are on the way
// to synced, and the process never holds all the fragments, nor all the
// messages, at once.

// placedPort is a service port and what a full sync places of it.
type placedPort struct {
	key  string
	name model.ServicePortName
	svc  *model.ServicePort
	eps  []model.Endpoint
	kind TableKind
}

// portRules is about how many rules a service port's fragment holds:
// three an endpoint (two in its KUBE-SEP chain, one in the service's
// chain to reach it) and one.
func portRules(pt placedPort) int { return 3*len(pt.eps) + 1 }

// stagesFull reports whether a full sync of ports into want (the tables'
// fixed parts) is staged: large enough, no trace (which prints a sync as
// one transaction), and none of the tables in the kernel.
func (b *Backend) stagesFull(ports []placedPort, want map[tableID]*nftlib.Table) bool {
	if b.tx.trace != nil {
		return false
	}
	rules := 0
	for _, pt := range ports {
		rules += portRules(pt)
	}
	return rules >= 2*b.strategy.StageRules && b.tablesAbsent(want)
}

// tablesAbsent reports whether the kernel holds none of the tables.
func (b *Backend) tablesAbsent(want map[tableID]*nftlib.Table) bool {
	for _, f := range nftlib.Families {
		var names []string
		for _, id := range tableIDs() {
			if id.f == f && want[id] != nil {
				names = append(names, want[id].Name)
			}
		}
		have, err := b.k.HasTables(f, names)
		if err != nil {
			return false // the full sync's own read reports it
		}
		for _, n := range names {
			if have[n] {
				return false
			}
		}
	}
	return true
}

// allFresh reports whether every transaction creates its table.
func allFresh(txs []*nftlib.Tx) bool {
	for _, x := range txs {
		if !x.Fresh() {
			return false
		}
	}
	return true
}

// stagedTxs is the staged transactions of a full sync whose plan
// deferred its fragments, each a list of table transactions to commit as
// one: first the tables with their sets and regular chains, then the
// Service ports' chains, built in key order as they are asked for; each
// fragment's elements go to txs (one per table, in tableIDs order), the
// sync's last transaction.
func (b *Backend) stagedTxs(p *syncPlan, txs []*nftlib.Tx) iter.Seq[[]*nftlib.Tx] {
	return func(yield func([]*nftlib.Tx) bool) {
		var first []*nftlib.Tx
		for _, x := range txs {
			if f := x.StageFixed(); f != nil {
				first = append(first, f)
			}
		}
		if !yield(first) {
			return
		}
		ports := p.deferred
		total := 0
		for _, pt := range ports {
			total += portRules(pt)
		}
		size := max(total/b.strategy.StagePieces, b.strategy.StageRules)
		for lo := 0; lo < len(ports); {
			hi, n := lo, 0
			for hi < len(ports) && n < size {
				n += portRules(ports[hi])
				hi++
			}
			// The first piece is built on all CPUs: nothing else runs yet.
			if !yield(b.buildPiece(p, txs, ports[lo:hi], lo == 0)) {
				return
			}
			lo = hi
		}
	}
}

// buildPiece builds the fragments of ports and returns, per table, the
// transaction that adds their chains; their elements go to txs.
func (b *Backend) buildPiece(p *syncPlan, txs []*nftlib.Tx, ports []placedPort, parallel bool) []*nftlib.Tx {
	built := buildFragments(p.want, b.cfg, p.node, ports, parallel)
	ids := tableIDs()
	index := make(map[tableID]int, len(ids)) // txs are in tableIDs order
	for t, id := range ids {
		index[id] = t
	}
	chains := make([][]*nftlib.Chain, len(ids))
	for i, pt := range ports {
		for j, f := range nftlib.Families {
			if fr := built[i][j]; fr != nil { // only for the tables p.want has
				t := index[tableID{f, pt.kind}]
				chains[t] = append(chains[t], fr.Chains...)
				txs[t].AddElements(fr.Elements)
			}
		}
	}
	var out []*nftlib.Tx
	for t, id := range ids {
		if len(chains[t]) > 0 {
			out = append(out, nftlib.ChainsTx(p.want[id], chains[t]))
		}
	}
	return out
}

// commitStaged commits pieces, each a transaction of its own, and then
// txs as one: the kernel takes each while a goroutine builds and encodes
// the next. A refused one ends it: the chains the pieces before created
// are not reachable, and the full sync that follows a failure rewrites
// the tables (see Backend.markReplace). After the last, a large one is
// settled. release and releaseBytes: see encodeStaged.
func (c *committer) commitStaged(pieces iter.Seq[[]*nftlib.Tx], txs []*nftlib.Tx, settle *nftlib.TableRef, release func(), releaseBytes int) commitReport {
	return c.around(true, settle, func(r *commitReport) {
		next, stop := make(chan nftlib.KernelTx), make(chan struct{})
		go c.encodeStaged(pieces, txs, next, stop, release, releaseBytes)
		for kt := range next {
			if r.err != nil {
				c.k.DiscardTx(kt)
				continue
			}
			r.messages, r.bytes = r.messages+kt.Messages(), r.bytes+kt.Size()
			d, err := timed(func() error { return c.k.CommitTx(kt) })
			r.kernel += d
			if err != nil {
				r.err = err
				close(stop)
				continue
			}
			r.commits++
		}
		r.staged = max(int(r.commits)-1, 0)
	})
}

// encodeStaged writes each piece, then txs, into a transaction of its
// own and hands it to next, until stop. After every second piece handed
// over, once releaseBytes more were, release
// (Strategy.OnLargeTxRound), when set, collects the fragments built and
// encoded so far and hands their pages back: on this goroutine, while the
// kernel commits.
func (c *committer) encodeStaged(pieces iter.Seq[[]*nftlib.Tx], txs []*nftlib.Tx, next chan<- nftlib.KernelTx, stop <-chan struct{}, release func(), releaseBytes int) {
	defer close(next)
	var setID uint32
	kt := c.k.NewTx()
	sent, unreleased := 0, 0
	for piece := range pieces {
		for _, x := range piece {
			x.Write(kt, &setID)
		}
		if kt.Messages() == 0 {
			continue
		}
		following := c.k.NextTx(kt)
		unreleased += kt.Size()
		if !handOver(next, stop, kt) {
			c.k.DiscardTx(following)
			return
		}
		kt = following
		if sent++; release != nil && sent >= 2 && unreleased >= releaseBytes {
			release()
			sent, unreleased = 0, 0
		}
	}
	for _, x := range txs {
		x.Write(kt, &setID)
	}
	if kt.Messages() == 0 || !handOver(next, stop, kt) {
		c.k.DiscardTx(kt)
	}
}

// handOver sends kt on next unless stop comes first.
func handOver(next chan<- nftlib.KernelTx, stop <-chan struct{}, kt nftlib.KernelTx) bool {
	select {
	case next <- kt:
		return true
	case <-stop:
		return false
	}
}
