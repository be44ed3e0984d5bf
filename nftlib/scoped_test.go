package nftlib

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// scopedTable is the table the ScopedDrift cases program and another
// process then changes:
//
//	table ip t {
//		comment "scoped"
//		map m { type ipv4_addr : verdict; elements = { 10.0.0.1 : goto a, 10.0.0.2 : goto b } }
//		set allowed { type ipv4_addr; elements = { 10.1.0.1 } }
//		set sticky { typeof ip saddr . numgen random mod 1; ... }
//		chain in { type filter hook input priority filter; policy accept; ip daddr vmap @m }
//		chain a { accept }
//		chain b { drop }
//		chain c { jump a }
//		# fragment f: chain f { return }, m: 10.0.0.3 : goto f
//	}
func scopedTable() *Table {
	elem := func(addr, chain string) Element {
		return Element{Key: Key{Addr: netip.MustParseAddr(addr)}, Verdict: GotoChain(chain)}
	}
	return &Table{Family: IPv4, Name: "t", Comment: "scoped", Sticky: "sticky", StickyComment: "sources",
		Maps: []*Map{
			{Name: "m", Key: []Field{FieldDaddr}, Elements: []Element{elem("10.0.0.1", "a"), elem("10.0.0.2", "b")}},
			{Name: "allowed", Key: []Field{FieldSaddr}, Plain: true, Elements: []Element{{Key: Key{Addr: netip.MustParseAddr("10.1.0.1")}}}},
		},
		Chains: []*Chain{
			{Name: "in", Hook: &Hook{Type: "filter", Hook: "input"}, Rules: []Rule{R(Vmap("m", FieldDaddr))}},
			{Name: "a", Rules: []Rule{R(Verdict{Kind: Accept})}},
			{Name: "b", Rules: []Rule{R(Verdict{Kind: Drop})}},
			{Name: "c", Rules: []Rule{R(JumpTo("a"))}},
		},
		Fragments: map[string]*Fragment{"f": {Chains: []*Chain{{Name: "f", Rules: []Rule{R(Verdict{Kind: Return})}}},
			Elements: []MapElement{{Map: "m", Element: elem("10.0.0.3", "f")}}}}}
}

// scopedCase is another process's change to scopedTable, what
// ScopedDrift finds of it in the scope the change monitor names, and the
// repair (its two transactions as nft commands, "--" between them).
type scopedCase struct {
	name   string
	nft    string       // the other process's commands
	scope  *ChangeScope // when not nil, used in place of the monitor's
	stale  []string
	diffs  string // one a line
	repair string
	err    string // ScopedDrift fails with this, and finds nothing
}

func scopedCases() []scopedCase {
	return []scopedCase{
		{name: "a rule appended to a chain of ours", nft: "add rule ip t a drop",
			diffs:  "chain a: rule 2 (handle 14) is not ours",
			repair: "delete rule ip t a handle 14\n--\n"},
		{name: "a rule inserted before ours", nft: "insert rule ip t c drop",
			diffs:  "chain c: rule 1 (handle 14) is not ours",
			repair: "delete rule ip t c handle 14\n--\n"},
		{name: "a chain of ours flushed", nft: "flush chain ip t a",
			diffs:  "chain a: 0 rules, want 1",
			repair: "flush chain ip t a\nadd rule ip t a accept\n--\n"},
		{name: "a rule of ours replaced", nft: "flush chain ip t b\nadd rule ip t b accept",
			diffs:  "chain b: rule 1 differs, want \"drop\"",
			repair: "flush chain ip t b\nadd rule ip t b drop\n--\n"},
		{name: "a chain of ours deleted", nft: "delete chain ip t c",
			diffs:  "chain c: missing",
			repair: "add chain ip t c\nadd rule ip t c jump a\n--\n"},
		{name: "a fragment's chain flushed", nft: "flush chain ip t f",
			diffs:  "chain f: 0 rules, want 1",
			repair: "flush chain ip t f\nadd rule ip t f return\n--\n"},
		{name: "a chain not ours, with a set not ours", nft: "add set ip t xs { type ipv4_addr; }\nadd chain ip t x\nadd rule ip t x ip saddr @xs jump a",
			diffs:  "chain x: not ours\nset xs: not ours",
			repair: "flush chain ip t x\n--\ndelete set ip t xs\ndelete chain ip t x\n"},
		{name: "a base chain not ours", nft: "add chain ip t out { type filter hook output priority 0; policy drop; }",
			diffs:  "chain out: not ours, a base chain (type filter hook output priority 0 policy drop flags 0x1)",
			repair: "delete chain ip t out\n--\n"},
		{name: "our base chain's policy changed", nft: "add chain ip t in { type filter hook input priority 0; policy drop; }",
			diffs: "chain in: type filter hook input priority 0 policy drop flags 0x1, want type filter hook input priority 0 policy accept flags 0x1",
			repair: "delete chain ip t in\nadd chain ip t in { type filter hook input priority filter; policy accept; }\n" +
				"add rule ip t in ip daddr vmap @m\n--\n"},
		{name: "a chain of ours made a base chain", nft: "delete chain ip t c\nadd chain ip t c { type filter hook output priority 0; }",
			err: "chain c: type filter hook output priority 0 policy accept flags 0x1, want a regular chain (flags 0x0)"},
		{name: "a chain left to delete changed", nft: "add chain ip t s", stale: []string{"s"},
			err: "chain s is left to delete"},
		{name: "an element of ours deleted", nft: "delete element ip t m { 10.0.0.1 }",
			diffs:  "map m: element 10.0.0.1 missing",
			repair: "add element ip t m { 10.0.0.1 : goto a }\n--\n"},
		{name: "an element's verdict changed", nft: "delete element ip t m { 10.0.0.1 }\nadd element ip t m { 10.0.0.1 : goto b }",
			diffs:  "map m: element 10.0.0.1 has verdict -4 b, want goto a",
			repair: "delete element ip t m { 10.0.0.1 }\nadd element ip t m { 10.0.0.1 : goto a }\n--\n"},
		{name: "an element not ours", nft: "add element ip t m { 10.0.0.9 : accept }",
			diffs: "map m: element 10.0.0.9 is not ours",
			repair: "flush map ip t m\nadd element ip t m { 10.0.0.1 : goto a }\nadd element ip t m { 10.0.0.2 : goto b }\n" +
				"add element ip t m { 10.0.0.3 : goto f }\n--\n"},
		{name: "a set element's comment changed", nft: "delete element ip t allowed { 10.1.0.1 }\nadd element ip t allowed { 10.1.0.1 comment \"x\" }",
			diffs:  "set allowed: element 10.1.0.1: comment differs",
			repair: "delete element ip t allowed { 10.1.0.1 }\nadd element ip t allowed { 10.1.0.1 }\n--\n"},
		{name: "our set deleted", nft: "delete set ip t allowed",
			diffs:  "map allowed: missing",
			repair: "add set ip t allowed { type ipv4_addr; }\nadd element ip t allowed { 10.1.0.1 }\n--\n"},
		{name: "our set of another type", nft: "delete set ip t allowed\nadd set ip t allowed { type ipv6_addr; }",
			err: "map allowed: flags 0x0 key type 0x8 (16 bytes) data type 0x0, want a plain set with flags 0x0 key type 0x7 (4 bytes)"},
		{name: "the sticky set deleted", nft: "delete set ip t sticky",
			diffs:  "set sticky: missing",
			repair: "add set ip t sticky { typeof ip saddr . numgen random mod 1; size 1048576; flags dynamic,timeout; }\n--\n"},
		{name: "the sticky set of another type", nft: "delete set ip t sticky\nadd set ip t sticky { type ipv4_addr; }",
			err: "set sticky: flags 0x0 key type 0x7 (4 bytes), want flags 0x30 key type 0x1c4 (8 bytes)"},
		{name: "the table made dormant", nft: "add table ip t { flags dormant; }",
			diffs:  "table ip t: flags 0x1, want 0",
			repair: "add table ip t { comment \"scoped\"; }\n--\n"},
		{name: "a counter and a quota not ours", nft: "add counter ip t k\nadd quota ip t q { over 1 mbytes }",
			diffs:  "counter k: not ours\nquota q: not ours",
			repair: "--\ndelete counter ip t k\ndelete quota ip t q\n"},
		{name: "the table deleted", nft: "delete table ip t", err: "the whole table may have changed"},
		{name: "the table's comment changed", nft: "delete table ip t\nadd table ip t { comment \"other\"; }",
			scope: &ChangeScope{Table: true}, err: "the table's comment differs"},
		{name: "the table missing", nft: "delete table ip t", scope: &ChangeScope{Table: true}, err: "the table is missing"},
		{name: "nothing changed", scope: &ChangeScope{Table: true, Stateful: true,
			Chains: map[string]bool{"a": true, "in": true, "f": true, "gone": true}, Sets: map[string]bool{"m": true, "allowed": true, "sticky": true}}},
	}
}

// Each change another process makes is found in the scope the change
// monitor names, and repaired in place by the transactions ScopedDrift
// returns: afterwards the whole table is as it should be, and the same
// scope shows nothing more.
func TestKernelScopedDrift(t *testing.T) {
	for _, tc := range scopedCases() {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			k := openTestKernel(t, ns)
			want := scopedTable()
			full, _ := FullTx(want, &KernelTable{}, false)
			commitTxs(t, k, full)
			if err := k.Watch([]TableRef{{IPv4, "t"}}, MonitorRcvBuf, nil); err != nil {
				t.Fatal(err)
			}
			scope := otherProcessChanges(t, ns, k, tc.nft)
			if tc.scope != nil {
				scope = *tc.scope
			}
			diffs, txs, err := k.ScopedDrift(want, scope, tc.stale)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || diffs != nil || txs != nil {
					t.Fatalf("ScopedDrift: %q, %d transactions, error %v; want the error %q", diffs, len(txs), err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(diffs, "\n"); got != tc.diffs {
				t.Errorf("differences:\n%s\nwant:\n%s", got, tc.diffs)
			}
			if tc.diffs == "" {
				if txs != nil {
					t.Errorf("%d repair transactions for no difference", len(txs))
				}
				return
			}
			if got := script(txs...); got != tc.repair {
				t.Errorf("repair:\n%s\nwant:\n%s", got, tc.repair)
			}
			commitTxs(t, k, txs...)
			checkNoDrift(t, k, want, tc.stale)
			if diffs, txs, err := k.ScopedDrift(want, scope, tc.stale); diffs != nil || txs != nil || err != nil {
				t.Errorf("after the repair: %q, %d transactions, %v; want nothing", diffs, len(txs), err)
			}
		})
	}
}

// otherProcessChanges runs nft commands in ns, as another process, and
// returns the scope of ip t the change monitor of k saw them change
// (none when script is empty).
func otherProcessChanges(t *testing.T, ns string, k *Kernel, script string) ChangeScope {
	t.Helper()
	if script == "" {
		return ChangeScope{}
	}
	testns.NFTScript(t, ns, script+"\n")
	mon := k.Monitor()
	testutil.WaitFor(t, 10*time.Second, "the change monitor to see the change", mon.Pending)
	scopes, all := mon.TakeScopes()
	if all || mon.Pending() {
		t.Fatalf("the monitor marked every table (%v) or kept marks after the take", all)
	}
	return scopes[TableRef{IPv4, "t"}]
}

// The fake kernel compares whole tables only: its ScopedDrift always
// sends the caller to TableDrift.
func TestFakeKernelScopedDriftRefuses(t *testing.T) {
	k := NewFakeKernel()
	if diffs, txs, err := k.ScopedDrift(scopedTable(), ChangeScope{Chains: map[string]bool{"a": true}}, nil); err == nil || diffs != nil || txs != nil {
		t.Errorf("ScopedDrift on the fake: %q, %d transactions, %v; want an error", diffs, len(txs), err)
	}
}
