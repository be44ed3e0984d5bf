package nftlib

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// fakeCaseTable is what each fakeCase starts from:
//
//	table ip t {
//		map m { type ipv4_addr : verdict; elements = { 10.0.0.1 : goto c } }
//		chain a { jump b }
//		chain b { }
//		chain c { }
//		chain d { }
//	}
func fakeCaseTable() *Table {
	elem := Element{Key: Key{Addr: netip.MustParseAddr("10.0.0.1")}, Verdict: GotoChain("c")}
	return &Table{Family: IPv4, Name: "t",
		Maps:   []*Map{{Name: "m", Key: []Field{FieldDaddr}, Elements: []Element{elem}}},
		Chains: []*Chain{{Name: "a", Rules: []Rule{R(JumpTo("b"))}}, {Name: "b"}, {Name: "c"}, {Name: "d"}}}
}

// fakeCase is one transaction over fakeCaseTable and the kernel's answer.
type fakeCase struct {
	name   string
	write  func(tx KernelTx)
	errno  syscall.Errno // 0: committed
	chains string        // ip t's chains afterwards; "-": no table
	// kernel lists the kernel's other answers to the same transaction:
	// another errno, or 0 where an older kernel commits it.
	kernel []syscall.Errno
}

func fakeCases() []fakeCase {
	const f, tb = IPv4, "t"
	m := fakeCaseTable().Maps[0]
	elem := func(chain string) []Element {
		return []Element{{Key: Key{Addr: netip.MustParseAddr("10.0.0.1")}, Verdict: GotoChain(chain)}}
	}
	return []fakeCase{
		{"add chain ip t e", func(tx KernelTx) { tx.AddChains(f, tb, []*Chain{{Name: "e"}}) }, 0, "a b c d e", nil},
		{"add table ip t", func(tx KernelTx) { tx.AddTable(f, tb, "") }, 0, "a b c d", nil},
		{"add rule ip t a jump nope", func(tx KernelTx) { tx.AddRule(f, tb, "a", R(JumpTo("nope"))) }, syscall.ENOENT, "a b c d", nil},
		{"flush chain ip t nope", func(tx KernelTx) { tx.FlushChain(f, tb, "nope") }, syscall.ENOENT, "a b c d", nil},
		{"delete chain ip t nope", func(tx KernelTx) { tx.DelChain(f, tb, "nope") }, syscall.ENOENT, "a b c d", nil},
		{"delete chain ip t d", func(tx KernelTx) { tx.DelChain(f, tb, "d") }, 0, "a b c", nil},
		{"delete chain ip t b (a jumps to it)", func(tx KernelTx) { tx.DelChain(f, tb, "b") }, syscall.EBUSY, "a b c d", nil},
		{"delete chain ip t c (an element of m goes to it)", func(tx KernelTx) { tx.DelChain(f, tb, "c") }, syscall.EBUSY, "a b c d", nil},
		{"flush chain ip t a; delete chain ip t b", func(tx KernelTx) {
			tx.FlushChain(f, tb, "a")
			tx.DelChain(f, tb, "b")
		}, 0, "a c d", nil},
		{"add chain ip t e; delete chain ip t b: all or nothing", func(tx KernelTx) {
			tx.AddChains(f, tb, []*Chain{{Name: "e"}})
			tx.DelChain(f, tb, "b")
		}, syscall.EBUSY, "a b c d", nil},
		{"add map ip t m { type ipv4_addr . ipv4_addr : verdict; }", func(tx KernelTx) {
			tx.addMap(f, tb, &Map{Name: "m", Key: []Field{FieldDaddr, FieldSaddr}}, 1)
		}, syscall.EEXIST, "a b c d", []syscall.Errno{0}}, // Linux 5.10 keeps the old map and commits
		// Linux 6.18 answers EEXIST here; the fake, EBUSY.
		{"add element ip t m { 10.0.0.1 : goto d } (it goes to c)", func(tx KernelTx) { tx.Elements(true, f, tb, m, elem("d")) }, syscall.EBUSY, "a b c d", []syscall.Errno{syscall.EEXIST}},
		{"add element ip t m { 10.0.0.1 : goto c } (as it is)", func(tx KernelTx) { tx.Elements(true, f, tb, m, elem("c")) }, 0, "a b c d", nil},
		{"delete table ip t", func(tx KernelTx) { tx.DelTable(f, tb) }, 0, "-", nil},
		{"flush map ip t m", func(tx KernelTx) { tx.flushMap(f, tb, m) }, 0, "a b c d", nil},
		{"flush map ip t m; delete chain ip t c (nothing goes to it now)", func(tx KernelTx) {
			tx.flushMap(f, tb, m)
			tx.DelChain(f, tb, "c")
		}, 0, "a b d", nil},
		{"flush map ip t nope", func(tx KernelTx) { tx.flushMap(f, tb, &Map{Name: "nope", Key: m.Key}) }, syscall.ENOENT, "a b c d", nil},
		{"delete map ip t m", func(tx KernelTx) { tx.delSet(f, tb, "m") }, 0, "a b c d", nil},
		{"delete set ip t nope", func(tx KernelTx) { tx.delSet(f, tb, "nope") }, syscall.ENOENT, "a b c d", nil},
		{"add rule ip t d ip daddr vmap @m; delete map ip t m (the rule looks it up)", func(tx KernelTx) {
			tx.AddRule(f, tb, "d", R(Vmap("m", FieldDaddr)))
			tx.delSet(f, tb, "m")
		}, syscall.EBUSY, "a b c d", nil},
		{"add rule ip t d ip daddr vmap @nope", func(tx KernelTx) { tx.AddRule(f, tb, "d", R(Vmap("nope", FieldDaddr))) }, syscall.ENOENT, "a b c d", nil},
		{"add rule ip t d (a sticky match in a set the table lacks)", func(tx KernelTx) {
			tx.AddRule(f, tb, "d", R(StickyMatch{Set: "sticky", ID: 1}, Verdict{Kind: Accept}))
		}, syscall.ENOENT, "a b c d", nil},
		{"add rule ip t d (a sticky update of a set the table lacks)", func(tx KernelTx) {
			tx.AddRule(f, tb, "d", R(StickyUpdate{Set: "sticky", ID: 1, Timeout: time.Hour}))
		}, syscall.ENOENT, "a b c d", nil},
		{"add set ip t sticky; add rules matching and updating it", func(tx KernelTx) {
			tx.addStickySet(f, tb, "sticky", "sources", 1)
			tx.AddRule(f, tb, "d", R(StickyMatch{Set: "sticky", ID: 1}, Verdict{Kind: Accept}))
			tx.AddRule(f, tb, "d", R(StickyUpdate{Set: "sticky", ID: 1, Timeout: time.Hour}))
		}, 0, "a b c d", nil},
		{"add set ip t sticky; add rule matching it; delete set ip t sticky", func(tx KernelTx) {
			tx.addStickySet(f, tb, "sticky", "sources", 1)
			tx.AddRule(f, tb, "d", R(StickyMatch{Set: "sticky", ID: 1}, Verdict{Kind: Accept}))
			tx.delSet(f, tb, "sticky")
		}, syscall.EBUSY, "a b c d", nil},
		{"delete rule ip t a handle 9999", func(tx KernelTx) { tx.DelRule(f, tb, "a", 9999) }, syscall.ENOENT, "a b c d", nil},
		{"delete counter ip t nope", func(tx KernelTx) { tx.delObj(f, tb, kernelObject{Type: 1, Name: "nope"}) }, syscall.ENOENT, "a b c d", nil},
		{"delete flowtable ip t nope", func(tx KernelTx) { tx.delFlowtable(f, tb, "nope") }, syscall.ENOENT, "a b c d", nil},
		{"add table ip t, owned (it exists)", func(tx KernelTx) { tx.AddOwnedTable(f, tb, "") }, syscall.EEXIST, "a b c d", nil},
		{"add table ip u, owned", func(tx KernelTx) { tx.AddOwnedTable(f, "u", "") }, 0, "a b c d", nil},
	}
}

// runFakeCase writes fakeCaseTable into d, then the case's transaction,
// and compares the answer (errno, or kernelErrno too when d is the
// kernel) and the chains left with the case's.
func runFakeCase(t *testing.T, d Dataplane, tc fakeCase) {
	t.Helper()
	want := fakeCaseTable()
	setup := d.NewTx()
	x, _ := FullTx(want, &KernelTable{}, false)
	var setID uint32
	x.Write(setup, &setID)
	if err := d.CommitTx(setup); err != nil {
		t.Fatalf("writing the table: %v", err)
	}
	tx := d.NewTx()
	tc.write(tx)
	err := d.CommitTx(tx)
	if errno, ok := answer(err); !ok || errno != tc.errno && !isKernelAnswer(d, errno, tc) {
		t.Errorf("committing: %v, want errno %d (%v)", err, tc.errno, tc.errno)
	}
	kts, err := d.ReadFamily(IPv4, []string{"t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := "-"
	if kt := kts["t"]; kt.Exists {
		got = strings.Join(slices.Sorted(maps.Keys(kt.Chains)), " ")
	}
	if got != tc.chains {
		t.Errorf("ip t holds chains %q afterwards, want %q", got, tc.chains)
	}
}

// answer is a commit's errno: 0 for none, false for an error that is no
// TxError.
func answer(err error) (syscall.Errno, bool) {
	var txErr *TxError
	if err == nil {
		return 0, true
	}
	if errors.As(err, &txErr) {
		return txErr.Errno, true
	}
	return 0, false
}

// isKernelAnswer reports whether errno is one of the case's other
// answers, from the kernel.
func isKernelAnswer(d Dataplane, errno syscall.Errno, tc fakeCase) bool {
	_, kernel := d.(*Kernel)
	return kernel && slices.Contains(tc.kernel, errno)
}

// The FakeKernel answers each transaction as the doc says the kernel
// does (TestKernelFakeAnswersAsKernel checks the same cases on it).
func TestFakeKernelAnswers(t *testing.T) {
	for _, tc := range fakeCases() {
		t.Run(tc.name, func(t *testing.T) { runFakeCase(t, NewFakeKernel(), tc) })
	}
}

// The kernel gives the answers TestFakeKernelAnswers expects of the fake.
func TestKernelFakeAnswersAsKernel(t *testing.T) {
	for _, tc := range fakeCases() {
		t.Run(tc.name, func(t *testing.T) {
			k := openTestKernel(t, testns.New(t, "knp-nft-"))
			if strings.HasSuffix(tc.name, ", owned") && !hasOwnedTables(t) {
				t.Skip("no owned nftables tables before Linux 5.12: the kernel refuses the flag")
			}
			runFakeCase(t, k, tc)
		})
	}
}

// hasOwnedTables tells whether the kernel accepts NFT_TABLE_F_OWNER
// (5.12+), trying it in a namespace of its own.
func hasOwnedTables(t *testing.T) bool {
	t.Helper()
	k := openTestKernel(t, testns.New(t, "knp-nft-"))
	tx := k.NewTx()
	tx.AddOwnedTable(IPv4, "owner-probe", "")
	return k.CommitTx(tx) == nil
}
