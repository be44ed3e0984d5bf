package nftlib

import "fmt"

// Dataplane is what a Backend needs of the kernel's nftables: transactions
// to commit, the ruleset generation, the metadata a full sync reads, the
// read-back a drift check compares and a change monitor. *Kernel is the
// real one; a FakeKernel holds the tables in memory, for tests that run
// without privileges. Its methods are the package's own: no other type
// can be one.
type Dataplane interface {
	// NewTx starts a transaction; its operations go in through txWriter.
	NewTx() KernelTx
	// CommitTx sends a transaction: all of it applies, or none of it (a
	// *TxError says which message the kernel refused).
	CommitTx(tx KernelTx) error
	// NextTx starts a transaction to commit right after prev, which is
	// written but not committed yet: it can be written on another
	// goroutine while prev commits.
	NextTx(prev KernelTx) KernelTx
	// DiscardTx lets go of a transaction that will not be committed.
	DiscardTx(tx KernelTx)
	// Generation is the ruleset's generation: every process's commits
	// move it.
	Generation() (uint32, error)
	// PortID is our netlink port id, which owner-flagged tables record.
	PortID() uint32
	// HasTables reports which of the named tables of family f exist.
	HasTables(f Family, names []string) (map[string]bool, error)
	// ReadFamily reads the named tables' metadata (see Kernel.ReadFamily).
	ReadFamily(f Family, names []string, expect map[string][]string) (map[string]*KernelTable, error)
	// TableDrift describes every difference between t and the kernel's.
	TableDrift(t *Table, kt *KernelTable, stale []string) ([]string, error)
	// ScopedDrift describes the differences in what scope names of t, and
	// only there, with the transactions that repair them in place; an
	// error when they cannot be compared alone (see Kernel.ScopedDrift).
	ScopedDrift(t *Table, scope ChangeScope, stale []string) ([]string, []*Tx, error)
	// Monitor is the open change monitor; nil when there is none.
	Monitor() Watcher
	// Watch opens the change monitor of the given tables.
	Watch(tables []TableRef, rcvBuf int, onMark func()) error
}

// KernelTx is one transaction being written.
type KernelTx interface {
	txWriter
	// AddOwnedTable creates an empty table that only this transaction's
	// socket may change and that the kernel deletes when the socket
	// closes (see batch.AddOwnedTable).
	AddOwnedTable(f Family, name, comment string)
	Messages() int // netlink messages so far
	Size() int     // bytes so far
}

// Watcher follows other processes' commits to our tables.
type Watcher interface {
	// Pending reports marks not taken yet.
	Pending() bool
	// Take returns and clears the marked tables; all: events were lost.
	Take() (marked map[TableRef]bool, all bool)
	// TakeScopes is Take with what changed in each marked table.
	TakeScopes() (scopes map[TableRef]ChangeScope, all bool)
	// SetMember joins or leaves the notification group.
	SetMember(join bool) error
	// MarkAll marks every table, for a commit that went unseen.
	MarkAll()
}

var _ Dataplane = (*Kernel)(nil)

func (k *Kernel) NewTx() KernelTx { return k.startBatch() }

// NextTx numbers its messages after prev's (and prev's batch end), as
// the socket reads answers by sequence number.
func (k *Kernel) NextTx(prev KernelTx) KernelTx {
	if b, ok := prev.(*batch); ok {
		return newBatch(b.seq + 1)
	}
	return k.startBatch()
}

// HasTables lists the family's tables, without reading what they hold.
func (k *Kernel) HasTables(f Family, names []string) (map[string]bool, error) {
	kts, err := k.readTables(f, names)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(kts))
	for name, kt := range kts {
		out[name] = kt.Exists
	}
	return out, nil
}

// DiscardTx unmaps a batch that is not sent.
func (k *Kernel) DiscardTx(tx KernelTx) {
	if b, ok := tx.(*batch); ok {
		b.release()
	}
}

func (k *Kernel) CommitTx(tx KernelTx) error {
	bt, ok := tx.(*batch)
	if !ok {
		return fmt.Errorf("committing a %T: not a transaction of this kernel", tx)
	}
	err := k.commit(bt)
	k.finished(bt)
	return err
}

func (k *Kernel) Monitor() Watcher {
	if k.mon == nil {
		return nil // not a typed nil in the interface
	}
	return k.mon
}

// OtherChanges is signalled when another process than this Kernel
// changes an nftables table that the change monitor does not watch (or the
// monitor cannot tell which tables changed: lost events, a commit of ours
// sent out of the notification group that another one raced), and closed
// when the monitor stops. Nil while no monitor is open. It lets a reader
// of other programs' tables look only when they change, rather than
// polling; it costs nothing when nobody commits.
func (k *Kernel) OtherChanges() <-chan struct{} {
	if k.mon == nil {
		return nil
	}
	return k.mon.others
}

func (k *Kernel) Watch(tables []TableRef, rcvBuf int, onMark func()) error {
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
