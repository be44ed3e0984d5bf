package nft

import (
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// stagedRules is the least number of rules a staged transaction of a
// full sync over new tables carries (see nftlib.Tx.Stage), and a sync of
// twice that or more is staged (about 7k Services x 10 endpoints): each
// is about 30 MiB of messages and a fifth of a second of the kernel's
// time, and is encoded while the kernel takes the one before.
const stagedRules = 100_000

// stagedPieces is about how many staged transactions of Service chains a
// large sync is cut into: each commit walks every chain of the namespace,
// so more of them would cost the kernel more (17 instead of 9 at 50k
// Services: up to a few tenths of a second), and fewer would put more
// of the encoding before the first commit and hold more messages at once.
const stagedPieces = 8

// stage splits off the staged transactions of a full sync whose tables
// the kernel does not hold yet (a node's first start), leaving in txs
// the one transaction that makes them reachable. None when a table
// exists: its rewrite stays one transaction.
func stage(txs []*nftlib.Tx, pieceRules int) (pieces []*nftlib.Tx) {
	for _, x := range txs {
		pieces = append(pieces, x.Stage(pieceRules)...)
	}
	return pieces
}

// commitStaged commits pieces, each a transaction of its own, and then
// txs as one: the kernel takes each while a goroutine encodes the next,
// so that the encoding of all but the first is off the critical path.
// A refused one ends it: the chains the pieces before created are not
// reachable, and the full sync that follows a failure rewrites the
// tables (see Backend.markReplace). After the last, a large one is
// settled. release (BackendConfig.OnLargeTxRound), when set, is called
// on the encoding goroutine after the first fragments' piece and half
// way: it collects the build's garbage and the pieces already sent while
// the kernel works, off the critical path.
func (c *committer) commitStaged(pieces, txs []*nftlib.Tx, settle *nftlib.TableRef, release func()) commitReport {
	var r commitReport
	r.genBefore, r.genErr = c.k.Generation()
	m := c.k.Monitor()
	muted := m != nil && m.SetMember(false) == nil
	next, stop := make(chan nftlib.KernelTx), make(chan struct{})
	go c.encodeStaged(pieces, txs, next, stop, release)
	for kt := range next {
		if r.err != nil {
			c.k.DiscardTx(kt)
			continue
		}
		r.messages, r.bytes = r.messages+kt.Messages(), r.bytes+kt.Size()
		d, err := nftlib.Timed(func() error { return c.k.CommitTx(kt) })
		r.kernel += d
		if err != nil {
			r.err = err
			close(stop)
			continue
		}
		r.commits++
	}
	c.settleIfLarge(&r, settle)
	if muted {
		c.rejoin(m, r)
	}
	return r
}

// encodeStaged writes each piece, then txs, into a transaction of its
// own and hands it to next, until stop.
func (c *committer) encodeStaged(pieces, txs []*nftlib.Tx, next chan<- nftlib.KernelTx, stop <-chan struct{}, release func()) {
	defer close(next)
	var setID uint32
	kt := c.k.NewTx()
	n := len(pieces)
	for i, x := range pieces {
		x.Write(kt, &setID)
		pieces[i] = nil // its chains are garbage once encoded
		following := c.k.NextTx(kt)
		if !handOver(next, stop, kt) {
			c.k.DiscardTx(following)
			return
		}
		kt = following
		if release != nil && (i == 1 || i == n/2) {
			release()
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
