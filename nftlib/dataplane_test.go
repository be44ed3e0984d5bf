package nftlib

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// runDataplaneTxs checks what every Dataplane does around a transaction:
// a commit moves the generation, a discarded transaction changes nothing,
// NextTx starts one that commits after the last, HasTables sees the table,
// and a transaction of another Dataplane is refused.
func runDataplaneTxs(t *testing.T, d, other Dataplane) {
	gen := func() uint32 {
		t.Helper()
		g, err := d.Generation()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	gen0 := gen()
	tx := d.NewTx()
	msgs, size := tx.Messages(), tx.Size()
	tx.AddTable(IPv4, "t", "")
	if tx.Messages() != msgs+1 || tx.Size() <= size {
		t.Errorf("adding a table: %d messages of %d bytes, was %d of %d", tx.Messages(), tx.Size(), msgs, size)
	}
	if err := d.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	gen1 := gen()
	if gen1 == gen0 {
		t.Errorf("the generation stayed %d after a commit", gen0)
	}
	next := d.NextTx(tx)
	next.AddChains(IPv4, "t", []*Chain{{Name: "a"}})
	if err := d.CommitTx(next); err != nil {
		t.Fatalf("the next transaction: %v", err)
	}
	discarded := d.NewTx()
	discarded.AddChains(IPv4, "t", []*Chain{{Name: "b"}})
	d.DiscardTx(discarded)
	gen2 := gen()
	has, err := d.HasTables(IPv4, []string{"t", "nope"})
	if err != nil {
		t.Fatal(err)
	}
	if gen2 == gen1 || !has["t"] || has["nope"] || len(has) != 2 {
		t.Errorf("after a discarded transaction: generation %d (was %d), tables %v; want it moved once, t alone", gen2, gen1, has)
	}
	kts, err := d.ReadFamily(IPv4, []string{"t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(kts["t"].Chains)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("chains %q, want [a] (b's transaction was discarded)", got)
	}
	if err := d.CommitTx(other.NewTx()); err == nil {
		t.Errorf("committed a %T", other.NewTx())
	}
	if d.PortID() == 0 || d.Monitor() != nil {
		t.Errorf("port id %d, monitor %v; want a port id and no monitor before Watch", d.PortID(), d.Monitor())
	}
}

func TestFakeKernelTxs(t *testing.T) { runDataplaneTxs(t, NewFakeKernel(), &Kernel{}) }

func TestKernelTxs(t *testing.T) {
	runDataplaneTxs(t, openTestKernel(t, testns.New(t, "knp-nft-")), NewFakeKernel())
}

// The FakeKernel prints what it holds as nft lists it, keeps each
// committed transaction as nft commands, counts commits and tables read,
// refuses a transaction whole when asked to, and has no change monitor.
func TestFakeKernelBookkeeping(t *testing.T) {
	k := NewFakeKernel()
	want := scopedTable()
	want.Maps[0].Elements = want.Maps[0].Elements[:1]
	want.Chains, want.Fragments = want.Chains[:2], nil
	full, _ := FullTx(want, &KernelTable{}, false)
	commitTxs(t, k, full)
	refused := errors.New("no b")
	k.SetRefuse(func(command string) error {
		if strings.Contains(command, " b") {
			return refused
		}
		return nil
	})
	err := k.Commit(func(tx KernelTx) {
		tx.AddChains(IPv4, "t", []*Chain{{Name: "a2"}, {Name: "b"}})
	})
	var txErr *TxError
	if !errors.As(err, &txErr) || txErr.Op != "add chain ip t b" || txErr.Table != "t" || txErr.Errno != syscall.EINVAL || txErr.Msg != "no b" {
		t.Errorf("a refused command: %#v, want a TxError naming add chain ip t b", err)
	}
	k.SetRefuse(func(string) error { return syscall.EPERM })
	if err := k.Commit(func(tx KernelTx) { tx.FlushChain(IPv4, "t", "a") }); !errors.As(err, &txErr) || txErr.Errno != syscall.EPERM {
		t.Errorf("a command refused with EPERM: %v", err)
	}
	k.SetRefuse(nil)
	if _, err := k.ReadFamily(IPv4, []string{"t", "u"}, nil); err != nil {
		t.Fatal(err)
	}
	if k.Commits() != 1 || k.Reads() != 2 || len(k.Journal()) != 1 || k.Journal()[0] != script(full) {
		t.Errorf("%d commits, %d tables read, journal %q; want 1, 2 and the one transaction", k.Commits(), k.Reads(), k.Journal())
	}
	if err := k.Watch([]TableRef{{IPv4, "t"}}, MonitorRcvBuf, nil); err == nil || k.Monitor() != nil {
		t.Errorf("Watch: %v, monitor %v; want an error and none", err, k.Monitor())
	}
	if err := k.Commit(func(tx KernelTx) {
		tx.AddTable(IPv6, "t", "")
		tx.AddTable(IPv4, "s", "")
	}); err != nil {
		t.Fatal(err)
	}
	// By family, then by name.
	const listing = `table ip s {
}
table ip t {
	comment "scoped"
	set allowed {
		type ipv4_addr
		elements = { 10.1.0.1 }
	}

	map m {
		type ipv4_addr : verdict
		elements = { 10.0.0.1 : goto a }
	}

	set sticky {
		typeof ip saddr . numgen random mod 1
		size 1048576
		flags dynamic,timeout
		comment "sources"
	}

	chain a {
		accept
	}

	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr vmap @m
	}
}
table ip6 t {
}
`
	if got := k.String(); got != listing {
		t.Errorf("the fake holds:\n%s\nwant:\n%s", got, listing)
	}
}

// driftCase is a change of another process to scopedTable and the
// differences TableDrift describes: the kernel's, and the fake kernel's,
// which compares objects as nft text.
type driftCase struct {
	name   string
	change func(tx KernelTx)
	stale  []string
	kernel string
	fake   string
}

func driftCases() []driftCase {
	const f, tb = IPv4, "t"
	m := scopedTable().Maps[0]
	return []driftCase{
		{name: "nothing changed", change: func(KernelTx) {}},
		{name: "a chain of ours flushed", change: func(tx KernelTx) { tx.FlushChain(f, tb, "a") },
			kernel: "chain a: 0 rules, want 1",
			fake:   "missing: \tchain a {\n\t\taccept\n\t}\n\nnot ours: \tchain a {\n\t}\n"},
		{name: "an element deleted", change: func(tx KernelTx) { tx.Elements(false, f, tb, m, m.Elements[:1]) },
			kernel: "map m: element 10.0.0.1 missing",
			fake:   "missing: map m element 10.0.0.1 : goto a"},
		{name: "a chain not ours", change: func(tx KernelTx) {
			tx.AddChains(f, tb, []*Chain{{Name: "x"}})
			tx.AddRule(f, tb, "x", R(Verdict{Kind: Drop}))
		},
			kernel: "chain x: not ours\nchain x: not ours, 1 rules",
			fake:   "not ours: \tchain x {\n\t\tdrop\n\t}\n"},
		{name: "an empty chain left to delete", change: func(tx KernelTx) { tx.AddChains(f, tb, []*Chain{{Name: "s"}}) }, stale: []string{"s"}},
		{name: "a set not ours", change: func(tx KernelTx) { tx.addMap(f, tb, &Map{Name: "xs", Key: []Field{FieldSaddr}, Plain: true}, 9) },
			kernel: "set xs: not ours",
			fake:   "not ours: map xs [0] true \"\""},
		{name: "the sticky set deleted", change: func(tx KernelTx) { tx.delSet(f, tb, "sticky") },
			kernel: "set sticky: missing",
			fake:   "missing: set sticky \"sources\""},
	}
}

// runDriftCase programs scopedTable into d, applies the case's change as
// another process, and compares what TableDrift describes.
func runDriftCase(t *testing.T, d Dataplane, tc driftCase, want string) {
	tbl := scopedTable()
	full, _ := FullTx(tbl, &KernelTable{}, false)
	commitTxs(t, d, full)
	tx := d.NewTx()
	tc.change(tx)
	if err := d.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	kts, err := d.ReadFamily(IPv4, []string{"t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := d.TableDrift(tbl, kts["t"], tc.stale)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(diffs, "\n"); got != want {
		t.Errorf("differences:\n%s\nwant:\n%s", got, want)
	}
}

// TableDrift on the fake kernel finds each change TestKernelTableDrift
// finds on the kernel, as objects missing or not ours.
func TestFakeKernelTableDrift(t *testing.T) {
	for _, tc := range driftCases() {
		t.Run(tc.name, func(t *testing.T) { runDriftCase(t, NewFakeKernel(), tc, tc.fake) })
	}
}

func TestKernelTableDrift(t *testing.T) {
	for _, tc := range driftCases() {
		t.Run(tc.name, func(t *testing.T) {
			runDriftCase(t, openTestKernel(t, testns.New(t, "knp-nft-")), tc, tc.kernel)
		})
	}
}

// What only the kernel holds (stateful objects, anonymous sets, flags,
// sets of another type) and a long list of differences, which TableDrift
// cuts at maxDiffs.
func TestKernelTableDriftForeign(t *testing.T) {
	var many []string
	for i := range maxDiffs + 5 {
		many = append(many, fmt.Sprintf("10.2.0.%d", i+1))
	}
	for _, tc := range []struct {
		name, nft, want string
		cut             bool // want is the last line of maxDiffs+1
	}{
		{"a counter", "add counter ip t k", "counter k: not ours", false},
		{"the table made dormant", "add table ip t { flags dormant; }", "table ip t: flags 0x1, want 0", false},
		{"an anonymous set in a rule not ours", "add rule ip t c ip saddr { 10.9.0.1, 10.9.0.2 } drop",
			"set __set0: not ours, an anonymous set (goes with its rule)\nchain c: 2 rules, want 1", false},
		{"a base chain not ours", "add chain ip t out { type filter hook output priority 0; policy drop; }",
			"chain out: not ours, a base chain (type filter hook output priority 0 policy drop flags 0x1)", false},
		{"the sticky set of another type", "delete set ip t sticky\nadd set ip t sticky { type ipv4_addr; comment \"sources\"; }",
			"set sticky: flags 0x0 key type 0x7 (4 bytes), want flags 0x30 key type 0x1c4 (8 bytes)", false},
		{"the table deleted", "delete table ip t", "table ip t: missing", false},
		{"many elements not ours", "add element ip t allowed { " + strings.Join(many, ", ") + " }",
			"and 5 more differences", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			k := openTestKernel(t, ns)
			tbl := scopedTable()
			full, _ := FullTx(tbl, &KernelTable{}, false)
			commitTxs(t, k, full)
			testns.NFTScript(t, ns, tc.nft+"\n")
			kts, err := k.ReadFamily(IPv4, []string{"t"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			diffs, err := k.TableDrift(tbl, kts["t"], nil)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(diffs, "\n")
			if tc.cut && len(diffs) == maxDiffs+1 {
				got = diffs[maxDiffs] // the first maxDiffs come in the kernel's order
			}
			if got != tc.want {
				t.Errorf("differences:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TableInfo reads a table's attributes alone: its comment, and whether it
// exists.
func TestKernelTableInfo(t *testing.T) {
	k := openTestKernel(t, testns.New(t, "knp-nft-"))
	tx := k.NewTx()
	tx.AddTable(IPv4, "t", "a table")
	if err := k.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, comment string
		exists        bool
	}{{"t", "a table", true}, {"nope", "", false}} {
		kt, err := k.TableInfo(IPv4, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if kt.Exists != tc.exists || kt.Comment() != tc.comment {
			t.Errorf("ip %s: exists %v, comment %q; want %v, %q", tc.name, kt.Exists, kt.Comment(), tc.exists, tc.comment)
		}
	}
}

// TableOwnedError is ErrTableOwned to errors.Is, and says the refusal
// lasts until the owner goes.
func TestTableOwnedError(t *testing.T) {
	err := fmt.Errorf("syncing: %w", &TableOwnedError{Family: IPv4, Table: "t", Owner: 42})
	var owned *TableOwnedError
	if !errors.Is(err, ErrTableOwned) || !errors.As(err, &owned) || !owned.WaitsForOtherProcess() ||
		!strings.Contains(err.Error(), "table ip t is owned by another process (netlink port id 42") {
		t.Errorf("%v: not an ErrTableOwned that waits for its owner", err)
	}
}

// ReadElements reads the elements of each of the table's maps the kernel
// holds with their type (the fragments' too), and none of a map of
// another type or a missing table.
func TestKernelReadElements(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	k := openTestKernel(t, ns)
	tbl := scopedTable()
	full, _ := FullTx(tbl, &KernelTable{}, false)
	commitTxs(t, k, full)
	testns.NFTScript(t, ns, "delete set ip t allowed\nadd set ip t allowed { type ipv6_addr; elements = { fd00::1 } }\n")
	read := func(name string) string {
		t.Helper()
		kts, err := k.ReadFamily(IPv4, []string{name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := k.ReadElements(tbl, kts[name])
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, m := range slices.Sorted(maps.Keys(got)) {
			var elems []string
			for _, e := range got[m] {
				elems = append(elems, tbl.Map(m).elementText(IPv4, e))
			}
			slices.Sort(elems)
			lines = append(lines, m+": "+strings.Join(elems, ", "))
		}
		return strings.Join(lines, "\n")
	}
	if got, want := read("t"), "m: 10.0.0.1 : goto a, 10.0.0.2 : goto b, 10.0.0.3 : goto f"; got != want {
		t.Errorf("read back:\n%s\nwant:\n%s", got, want)
	}
	if got := read("nope"); got != "" {
		t.Errorf("read back from a missing table: %q", got)
	}
}
