package nft

import (
	"fmt"
	"time"
)

// Dataplane is what a Backend needs of the kernel's nftables: transactions
// to commit, the ruleset generation, the metadata a full sync reads, the
// read-back a drift check compares and a change monitor. *Kernel is the
// real one; *FakeKernel holds the tables in memory, for tests that run
// without privileges. Its methods are the package's own: no other type
// can be one.
type Dataplane interface {
	// newTx starts a transaction; its operations go in through txWriter.
	newTx() kernelTx
	// commit sends a transaction: all of it applies, or none of it (a
	// *TxError says which message the kernel refused).
	commit(tx kernelTx) error
	// generation is the ruleset's generation: every process's commits
	// move it.
	generation() (uint32, error)
	// portID is our netlink port id, which owner-flagged tables record.
	portID() uint32
	// readFamily reads the named tables' metadata (see Kernel.readFamily).
	readFamily(f Family, names []string, expect map[string][]string) (map[string]*kTable, error)
	// tableDrift describes every difference between t and the kernel's.
	tableDrift(t *Table, kt *kTable, stale []string) ([]string, error)
	// monitor is the open change monitor; nil when there is none.
	monitor() changeMonitor
	// watch opens the change monitor of the given tables.
	watch(tables []tableName, rcvBuf int, onMark func()) error
}

// kernelTx is one transaction being written.
type kernelTx interface {
	txWriter
	messages() int // netlink messages so far
	size() int     // bytes so far
}

// changeMonitor follows other processes' commits to our tables.
type changeMonitor interface {
	// pending reports marks not taken yet.
	pending() bool
	// take returns and clears the marked tables; all: events were lost.
	take() (marked map[tableName]bool, all bool)
	// setMember joins or leaves the notification group.
	setMember(join bool) error
	// markAll marks every table, for a commit that went unseen.
	markAll()
}

var _ Dataplane = (*Kernel)(nil)

func (k *Kernel) newTx() kernelTx { return k.newBatch() }

func (k *Kernel) commit(tx kernelTx) error {
	bt, ok := tx.(*batch)
	if !ok {
		return fmt.Errorf("committing a %T: not a transaction of this kernel", tx)
	}
	err := k.Apply(bt)
	k.finished(bt)
	return err
}

func (k *Kernel) generation() (uint32, error) { return k.Generation() }

func (k *Kernel) monitor() changeMonitor {
	if k.mon == nil {
		return nil // not a typed nil in the interface
	}
	return k.mon
}

func (k *Kernel) watch(tables []tableName, rcvBuf int, onMark func()) error {
	if k.mon != nil {
		return nil
	}
	m, err := k.openMonitor(tables, rcvBuf, onMark)
	if err != nil {
		return err
	}
	k.mon = m
	return nil
}

// timed runs fn and says how long it took.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}
