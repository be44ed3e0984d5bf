package nftlib

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// FakeKernel is an in-memory nftables for tests that run without
// privileges: it applies a Backend's transactions to tables held in
// memory, all of a transaction or none of it, and answers as the kernel
// does where our transactions depend on it: ENOENT for an object that does
// not exist (deleted, flushed, or the target of a jump, goto, map verdict
// or vmap), EBUSY for deleting a chain or set something still refers to
// or for adding an element whose key maps to another verdict (Linux 6.18
// answers that with EEXIST), EEXIST for a map of another type. It has no change monitor, so drift checks read
// every table back when the generation moved. The kernel tests prove the
// same behaviour on the real kernel.
type FakeKernel interface {
	Dataplane
	// Commit applies another process's commands, written by fn into a
	// transaction of their own (e.g. a chain flushed behind our back).
	Commit(fn func(tx KernelTx)) error
	// String prints what it holds as nft text.
	String() string
	// SetRefuse has refuse asked about each command of a transaction (as
	// nft text) before it applies; an error refuses the transaction, as
	// the kernel's *TxError naming that command and its table. Nil
	// refuses nothing.
	SetRefuse(refuse func(command string) error)
	// Journal holds each committed transaction, as nft commands.
	Journal() []string
	// Commits counts the committed transactions, Reads the tables read.
	Commits() int
	Reads() int
}

// fakeKernel is the FakeKernel.
type fakeKernel struct {
	tables  map[TableRef]*fakeTable
	gen     uint32
	refuse  func(command string) error
	journal []string
	commits int
	reads   int
}

type fakeTable struct {
	comment string
	sets    map[string]*fakeSet
	chains  map[string]*Chain // the rules are the table's own copy
}

// fakeSet is a verdict map (m) or the sticky set (m nil).
type fakeSet struct {
	m     *Map // nil for a sticky set
	elems map[Key]Element
	// stickyComment is a sticky set's comment.
	stickyComment string
}

var _ FakeKernel = (*fakeKernel)(nil)

// NewFakeKernel returns an empty ruleset.
func NewFakeKernel() FakeKernel { return &fakeKernel{tables: map[TableRef]*fakeTable{}} }

func (k *fakeKernel) SetRefuse(refuse func(command string) error) { k.refuse = refuse }
func (k *fakeKernel) Journal() []string                           { return k.journal }
func (k *fakeKernel) Commits() int                                { return k.commits }
func (k *fakeKernel) Reads() int                                  { return k.reads }

// fakeTx is a transaction for a FakeKernel: its commands as text and as
// changes to apply.
type fakeTx struct {
	ops   []fakeOp
	bytes int
}

type fakeOp struct {
	text  string
	table TableRef
	apply func(t *fakeTable, tables map[TableRef]*fakeTable) error
}

func (k *fakeKernel) NewTx() KernelTx { return &fakeTx{} }

func (k *fakeKernel) NextTx(KernelTx) KernelTx { return &fakeTx{} }

func (k *fakeKernel) DiscardTx(KernelTx) {}

// CommitTx applies every command to a copy of the tables, which replaces
// them only when all applied.
func (k *fakeKernel) CommitTx(kt KernelTx) error {
	x, ok := kt.(*fakeTx)
	if !ok {
		return fmt.Errorf("committing a %T: not a transaction of the fake kernel", kt)
	}
	tables := make(map[TableRef]*fakeTable, len(k.tables))
	for n, t := range k.tables {
		tables[n] = t.clone()
	}
	var script strings.Builder
	for _, op := range x.ops {
		err := k.refused(op.text)
		if err == nil {
			err = op.apply(tables[op.table], tables)
		}
		if err != nil {
			txErr := &TxError{Op: op.text, Family: op.table.Family, Table: op.table.Name}
			if !errors.As(err, &txErr.Errno) {
				txErr.Errno = syscall.EINVAL
				txErr.Msg = err.Error()
			}
			return txErr
		}
		script.WriteString(op.text + "\n")
	}
	k.tables = tables
	k.gen++
	k.commits++
	k.journal = append(k.journal, script.String())
	return nil
}

func (k *fakeKernel) refused(text string) error {
	if k.refuse == nil {
		return nil
	}
	return k.refuse(text)
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{comment: t.comment, sets: make(map[string]*fakeSet, len(t.sets)), chains: maps.Clone(t.chains)}
	for n, s := range t.sets {
		c.sets[n] = &fakeSet{m: s.m, elems: maps.Clone(s.elems), stickyComment: s.stickyComment}
	}
	return c // chains are replaced, never changed in place
}

func (k *fakeKernel) Generation() (uint32, error) { return k.gen, nil }
func (k *fakeKernel) PortID() uint32              { return 1 }
func (k *fakeKernel) Monitor() Watcher            { return nil }

func (k *fakeKernel) Watch([]TableRef, int, func()) error {
	return fmt.Errorf("the fake kernel has no change monitor")
}

// HasTables reports which of the named tables exist.
func (k *fakeKernel) HasTables(f Family, names []string) (map[string]bool, error) {
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = k.tables[TableRef{f, n}] != nil
	}
	return out, nil
}

// ReadFamily reports the named tables' metadata as the kernel would.
func (k *fakeKernel) ReadFamily(f Family, names []string, _ map[string][]string) (map[string]*KernelTable, error) {
	out := make(map[string]*KernelTable, len(names))
	for _, n := range names {
		k.reads++
		kt := &KernelTable{Chains: map[string]*kernelChain{}, Sets: map[string]*kernelSet{}, stateful: true}
		out[n] = kt
		t := k.tables[TableRef{f, n}]
		if t == nil {
			continue
		}
		kt.Exists, kt.udata = true, commentUdata(0, t.comment)
		for name, c := range t.chains {
			kt.Chains[name] = fakeKChain(c)
		}
		for name, s := range t.sets {
			kt.Sets[name] = fakeKSet(f, s)
		}
		kt.use = uint32(kt.counted())
	}
	return out, nil
}

func fakeKChain(c *Chain) *kernelChain {
	kc := &kernelChain{udata: commentUdata(0, c.Comment)}
	if h := c.Hook; h != nil {
		kc.Base, kc.typ, kc.hook, kc.priority, kc.policy, kc.Flags = true, h.Type, hookNumbers[h.Hook], h.Priority, nfAccept, nftChainBase
	}
	return kc
}

func fakeKSet(f Family, s *fakeSet) *kernelSet {
	if s.m == nil {
		return &kernelSet{Flags: stickyFlags, KeyType: stickyKeyType(f), KeyLen: stickyKeyLen(f), Udata: stickyUserdata(f, s.stickyComment)}
	}
	if s.m.Plain {
		return &kernelSet{Flags: s.m.flags(), KeyType: concatType(f, s.m.Key), KeyLen: keyLen(f, s.m.Key), Udata: commentUdata(SetCommentType, s.m.Comment)}
	}
	return &kernelSet{Flags: unix.NFT_SET_MAP, KeyType: concatType(f, s.m.Key), KeyLen: keyLen(f, s.m.Key),
		DataType: VerdictType, Udata: commentUdata(SetCommentType, s.m.Comment)}
}

// ScopedDrift is not read chain by chain here: the fake kernel has no
// change monitor to name chains, and the error makes a caller compare
// the whole table.
func (k *fakeKernel) ScopedDrift(*Table, ChangeScope, []string) ([]string, []*Tx, error) {
	return nil, nil, errors.New("the fake kernel compares whole tables only")
}

// TableDrift compares the table's objects, as nft text, with t's; the
// empty chains named stale may remain.
func (k *fakeKernel) TableDrift(t *Table, kt *KernelTable, stale []string) ([]string, error) {
	have := map[string]bool{}
	if ft := k.tables[TableRef{t.Family, t.Name}]; ft != nil && kt.Exists {
		for _, o := range tableObjects(ft.table(t.Family, t.Name)) {
			have[o] = true
		}
		for _, name := range stale {
			if c := ft.chains[name]; c != nil && len(c.Rules) == 0 {
				delete(have, chainObject(c, t.Family))
			}
		}
	}
	var diffs []string
	for _, o := range tableObjects(t) {
		if !have[o] {
			diffs = append(diffs, "missing: "+o)
		}
		delete(have, o)
	}
	for _, o := range slices.Sorted(maps.Keys(have)) {
		diffs = append(diffs, "not ours: "+o)
	}
	return diffs, nil
}

// tableObjects lists a table's chains and map elements as nft text, one
// string each.
func tableObjects(t *Table) []string {
	out := []string{"comment " + quoteComment(t.Comment)}
	for _, c := range t.AllChains() {
		out = append(out, chainObject(c, t.Family))
	}
	for _, m := range t.Maps {
		out = append(out, "map "+m.Name+" "+fmt.Sprint(m.Key)+" "+fmt.Sprint(m.Plain)+" "+quoteComment(m.Comment))
		for _, e := range t.Elements(m.Name) {
			out = append(out, "map "+m.Name+" element "+m.elementText(t.Family, e))
		}
	}
	if t.Sticky != "" {
		out = append(out, "set "+t.Sticky+" "+quoteComment(t.StickyComment))
	}
	return out
}

func chainObject(c *Chain, f Family) string {
	var b strings.Builder
	c.renderTo(&b, f)
	return b.String()
}

// String prints every table the fake holds as nft text, as `nft list
// ruleset` would (families and tables, chains and elements sorted).
func (k *fakeKernel) String() string {
	var b strings.Builder
	names := slices.SortedFunc(maps.Keys(k.tables), func(a, b TableRef) int {
		if a.Family != b.Family {
			return int(a.Family) - int(b.Family)
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, n := range names {
		k.tables[n].table(n.Family, n.Name).renderTo(&b)
	}
	return b.String()
}

// table is the fake table as a Table: chains by name, elements by text.
func (t *fakeTable) table(f Family, name string) *Table {
	out := &Table{Family: f, Name: name, Comment: t.comment, Fragments: map[string]*Fragment{}}
	for _, sn := range slices.Sorted(maps.Keys(t.sets)) {
		s := t.sets[sn]
		if s.m == nil {
			out.Sticky, out.StickyComment = sn, s.stickyComment
			continue
		}
		m := &Map{Name: s.m.Name, Key: s.m.Key, Comment: s.m.Comment, Plain: s.m.Plain, Interval: s.m.Interval}
		for _, e := range s.elems {
			m.Elements = append(m.Elements, e)
		}
		slices.SortFunc(m.Elements, func(a, b Element) int { return strings.Compare(m.elementText(f, a), m.elementText(f, b)) })
		out.Maps = append(out.Maps, m)
	}
	for _, cn := range slices.Sorted(maps.Keys(t.chains)) {
		out.Chains = append(out.Chains, t.chains[cn])
	}
	return out
}

// Commit applies another process's commands, written by fn into a
// transaction of their own (e.g. a chain flushed behind our back).
func (k *fakeKernel) Commit(fn func(tx KernelTx)) error {
	x := &fakeTx{}
	fn(x)
	return k.CommitTx(x)
}
