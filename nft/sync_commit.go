package nft

import (
	"io"
	"log/slog"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// committer sends one sync's table transactions to the kernel as one
// transaction, keeping the change monitor out of the notification group
// while a large one commits and settling a large full sync.
type committer struct {
	k   nftlib.Dataplane
	log *slog.Logger
	// trace, when set, receives each transaction as nft commands.
	trace io.Writer
}

// commitReport is what one commit did.
type commitReport struct {
	messages, bytes int
	kernel          time.Duration // the kernel's part
	// genBefore is the ruleset generation read just before the commit
	// (genErr: it could not be read), commits how many transactions of
	// ours committed since (the sync's, and settle's).
	genBefore uint32
	genErr    error
	commits   uint32
	err       error
	// settle is how long the settling transaction took (zero: none).
	settle time.Duration
	// staged is how many staged transactions came before the sync's last.
	staged int
}

func (r commitReport) ok() bool { return r.genErr == nil && r.err == nil }

// settleChain is the chain settle adds and deletes: not a name we build
// (ours are upper case or hook names).
const settleChain = "kube-nftproxy-settle"

// settleFrom is the size of a full sync (messages) from which settle
// follows it: below, the chains are few and their walk costs little.
const settleFrom = 10000

// muteAbove is the transaction size (messages) from which the change
// monitor leaves the notification group while we commit: below it, the
// kernel's cost of notifying is small, and staying in the group keeps
// other writers' changes in view.
const muteAbove = 1024

// write puts the non-empty table transactions into one kernel
// transaction (and the trace); it returns nil when all are empty. With
// release (and no trace, which prints the rules after), the fragments'
// rules are dropped as they are encoded, release called after each
// round of round rules (see nftlib.Tx.ReleaseRules).
func (c *committer) write(txs []*nftlib.Tx, round int, release func()) nftlib.KernelTx {
	var kt nftlib.KernelTx
	var setID uint32
	for _, x := range txs {
		if x.Empty() {
			continue
		}
		if kt == nil {
			kt = c.k.NewTx()
		}
		if release != nil && c.trace == nil {
			x.ReleaseRules(round, release)
		}
		id0 := setID
		x.Write(kt, &setID)
		if c.trace != nil {
			io.WriteString(c.trace, x.Script(&id0))
		}
	}
	return kt
}

// commit sends kt; after a full sync (settle: the table settle uses), a
// large one is settled.
func (c *committer) commit(kt nftlib.KernelTx, settle *nftlib.TableRef) commitReport {
	return c.around(kt.Messages() >= muteAbove, settle, func(r *commitReport) {
		r.messages, r.bytes = kt.Messages(), kt.Size()
		r.kernel, r.err = timed(func() error { return c.k.CommitTx(kt) })
		if r.err == nil {
			r.commits++
		}
	})
}

// around runs send, which commits a sync's transactions into r, after
// reading the ruleset generation (and leaving the notification group,
// when mute), then settles a large full sync and rejoins the group.
func (c *committer) around(mute bool, settle *nftlib.TableRef, send func(r *commitReport)) commitReport {
	var r commitReport
	r.genBefore, r.genErr = c.k.Generation()
	m := c.k.Monitor()
	muted := mute && m != nil && m.SetMember(false) == nil
	send(&r)
	c.settleIfLarge(&r, settle)
	if muted {
		c.rejoin(m, r)
	}
	return r
}

// settleIfLarge settles a large full sync that committed (settle: its
// table; nil for other syncs), into r.
func (c *committer) settleIfLarge(r *commitReport, settle *nftlib.TableRef) {
	if r.err != nil || settle == nil || r.messages < settleFrom {
		return
	}
	t0 := time.Now()
	if c.settle(*settle) == nil {
		r.commits++
	}
	r.settle = time.Since(t0)
}

// settle commits a transaction that changes nothing (a chain added and
// deleted) right after a full sync. Every commit walks every chain of the
// namespace, and the first one after a full sync also hands each chain's
// rules of the ruleset generation before to RCU to free, which would slow
// the next one-Service change. Done here, it is part of the full sync and
// not of the change that follows.
func (c *committer) settle(t nftlib.TableRef) error {
	kt := c.k.NewTx()
	kt.AddChains(t.Family, t.Name, []*nftlib.Chain{{Name: settleChain}})
	kt.DelChain(t.Family, t.Name, settleChain)
	err := c.k.CommitTx(kt)
	if err != nil {
		c.log.Warn("could not commit the transaction that settles a full sync; the next sync pays for it", "err", err)
	}
	return err
}

// rejoin puts the monitor back into the notification group after one of
// our transactions. Another process's commit in between went unseen: when
// the generation shows one, every table is marked for the next check.
func (c *committer) rejoin(m nftlib.Watcher, r commitReport) {
	joinErr := m.SetMember(true)
	after, err := c.k.Generation()
	if joinErr != nil || r.genErr != nil || err != nil || after != r.genBefore+r.commits {
		m.MarkAll()
	}
	if joinErr != nil {
		c.log.Warn("cannot rejoin the nftables notification group; drift checks read all tables back", "err", joinErr)
	}
}

// timed runs fn and says how long it took.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}
