package nftlib

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// watchedTable is the table the monitor tests watch, as nft writes it.
const watchedTable = `table ip t {
	set s { type ipv4_addr; }
	chain c { }
	chain d { }
}
`

// watchTestTable makes watchedTable in a new namespace and a Kernel
// watching it, with a receive buffer of rcvBuf bytes and onMark called
// as Watch says.
func watchTestTable(t *testing.T, rcvBuf int, onMark func()) (string, *Kernel) {
	t.Helper()
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, watchedTable)
	k := openTestKernel(t, ns)
	if err := k.Watch([]TableRef{{IPv4, "t"}}, rcvBuf, onMark); err != nil {
		t.Fatal(err)
	}
	return ns, k
}

// scopeText is a ChangeScope as one line: "whole", or what it names.
func scopeText(sc ChangeScope) string {
	if sc.Whole {
		return "whole"
	}
	var parts []string
	if sc.Table {
		parts = append(parts, "table")
	}
	if sc.Stateful {
		parts = append(parts, "stateful")
	}
	for _, named := range []struct {
		kind  string
		names map[string]bool
	}{{"chains", sc.Chains}, {"sets", sc.Sets}} {
		if len(named.names) > 0 {
			names := slices.Sorted(func(yield func(string) bool) {
				for n := range named.names {
					if !yield(n) {
						return
					}
				}
			})
			parts = append(parts, named.kind+" "+strings.Join(names, ","))
		}
	}
	return strings.Join(parts, "; ")
}

// signalled reports whether c holds a signal, taking it.
func signalled(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Another process's change to a watched table marks it with what it
// names; a change to any other table (of the same name in another family
// too) marks nothing and signals OtherChanges.
func TestKernelMonitorScopes(t *testing.T) {
	ns, k := watchTestTable(t, MonitorRcvBuf, nil)
	tests := []struct {
		name   string
		script string
		scope  string // of ip t; "": not marked
		other  bool   // OtherChanges signalled
	}{
		{"a rule added", "add rule ip t c drop", "chains c", false},
		{"rules in two chains", "add rule ip t c drop\nadd rule ip t d accept", "chains c,d", false},
		{"a chain added", "add chain ip t e", "chains e", false},
		{"a chain flushed and deleted", "add rule ip t d drop\nflush chain ip t d\ndelete chain ip t d", "chains d", false},
		{"an element added", "add element ip t s { 10.0.0.1 }", "sets s", false},
		{"a set added", "add set ip t s2 { type ipv4_addr; }", "sets s2", false},
		{"a counter added", "add counter ip t k", "stateful", false},
		{"the table made dormant", "add table ip t { flags dormant; }", "table", false},
		{"the table deleted", "delete table ip t", "whole", false},
		{"the same name in another family", "add table inet t\nadd chain inet t c", "", true},
		{"another table", "add table ip u\nadd chain ip u c", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Start from watchedTable again, its marks taken.
			testns.NFTScript(t, ns, "table ip t { }\ndelete table ip t\n"+watchedTable)
			k.mon.Take()
			signalled(k.OtherChanges())
			testns.NFTScript(t, ns, tc.script+"\n")
			scopes, all := k.mon.TakeScopes()
			got := ""
			if sc, ok := scopes[TableRef{IPv4, "t"}]; ok {
				got = scopeText(sc)
			}
			if all || len(scopes) > 1 || got != tc.scope {
				t.Errorf("marked %v (all: %v), ip t: %q; want %q", scopes, all, got, tc.scope)
			}
			if other := signalled(k.OtherChanges()); other != tc.other {
				t.Errorf("OtherChanges signalled: %v, want %v", other, tc.other)
			}
		})
	}
}

// The monitor drops our Kernel's own notifications in the kernel: a
// large transaction of ours, far more than its small buffer holds, leaves
// nothing queued and nothing marked.
func TestKernelMonitorIgnoresOwnCommits(t *testing.T) {
	_, k := watchTestTable(t, 4096, nil) // the kernel doubles it
	tx := k.NewTx()
	for i := range 2000 {
		tx.AddChains(IPv4, "t", []*Chain{{Name: fmt.Sprintf("own-%d", i), Rules: []Rule{R(Verdict{Kind: Accept})}}})
	}
	if err := k.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	marked, all := k.mon.Take()
	events, overruns := k.mon.Counts()
	if len(marked) > 0 || all || events > 0 || overruns > 0 {
		t.Errorf("after our own commit: marked %v all=%v events=%d overruns=%d, want nothing", marked, all, events, overruns)
	}
}

// commitChains commits n chains to table ip name through k, one
// transaction, named after *seq.
func commitChains(t *testing.T, k *Kernel, name string, n int, seq *int) {
	t.Helper()
	tx := k.NewTx()
	for range n {
		*seq++
		tx.AddChains(IPv4, name, []*Chain{{Name: fmt.Sprintf("c%d", *seq)}})
	}
	if err := k.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
}

// otherWriter opens a second Kernel in ns, as another process would
// (another port id), with a table of its own, ip other.
func otherWriter(t *testing.T, ns string) *Kernel {
	t.Helper()
	w := openTestKernel(t, ns)
	tx := w.NewTx()
	tx.AddTable(IPv4, "other", "")
	if err := w.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	return w
}

// A thousand commits of another process to its own table move the
// generation and are all parsed, without an overrun, yet mark nothing;
// a change to the watched table after them still marks it.
func TestKernelMonitorBusyOtherTables(t *testing.T) {
	ns, k := watchTestTable(t, MonitorRcvBuf, nil)
	w := otherWriter(t, ns)
	gen0, err := k.Generation()
	if err != nil {
		t.Fatal(err)
	}
	seq := 0
	for range 1000 {
		commitChains(t, w, "other", 1, &seq)
	}
	gen, err := k.Generation()
	if err != nil {
		t.Fatal(err)
	}
	if gen-gen0 < 1000 {
		t.Errorf("generation moved by %d, want >= 1000 commits", gen-gen0)
	}
	if marked, all := k.mon.Take(); len(marked) > 0 || all {
		t.Errorf("commits to another table marked %v (all: %v)", marked, all)
	}
	if events, overruns := k.mon.Counts(); events < 1000 || overruns > 0 {
		t.Errorf("parsed %d events with %d overruns, want >= 1000 and none", events, overruns)
	}
	testns.NFT(t, ns, "add", "rule", "ip", "t", "c", "drop")
	if marked, _ := k.mon.Take(); !marked[TableRef{IPv4, "t"}] {
		t.Errorf("a rule added to ip t after the busy writer marked %v", marked)
	}
}

// Events lost to a full receive buffer mark every table (an overrun
// counted); the next take, with nothing lost, marks none.
func TestKernelMonitorOverflowMarksAll(t *testing.T) {
	ns, k := watchTestTable(t, 4096, nil) // the kernel doubles it
	w := otherWriter(t, ns)
	seq := 0
	// Keep the reader out while thousands of notifications come at once.
	k.mon.mu.Lock()
	commitChains(t, w, "other", 5000, &seq)
	k.mon.mu.Unlock()
	if _, all := k.mon.Take(); !all {
		t.Error("after an overflow, the take does not mark every table")
	}
	if _, overruns := k.mon.Counts(); overruns == 0 {
		t.Fatal("no overrun: the test did not overflow the monitor")
	}
	commitChains(t, w, "other", 1, &seq)
	if marked, all := k.mon.Take(); len(marked) > 0 || all {
		t.Errorf("a small commit after the overflow marked %v (all: %v), want nothing", marked, all)
	}
}

// onMark is called when a table gets marked while nothing was pending: by
// a notification, or by MarkAll (a commit that went unseen); not again
// while the marks wait to be taken.
func TestKernelMonitorOnMark(t *testing.T) {
	var marks atomic.Int32
	ns, k := watchTestTable(t, MonitorRcvBuf, func() { marks.Add(1) })
	steps := []struct {
		what string
		do   func()
		want int32 // onMark calls so far
	}{
		{"MarkAll", k.mon.MarkAll, 1},
		{"MarkAll while marks are pending", k.mon.MarkAll, 1},
		{"a rule added while marks are pending", func() { testns.NFT(t, ns, "add", "rule", "ip", "t", "c", "drop") }, 1},
		{"the marks taken", func() { k.mon.Take() }, 1},
		{"MarkAll after the take", k.mon.MarkAll, 2},
		{"the marks taken again", func() { k.mon.Take() }, 2},
		{"a rule added", func() { testns.NFT(t, ns, "add", "rule", "ip", "t", "d", "drop") }, 3},
	}
	for _, s := range steps {
		s.do()
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%s: %d onMark calls", s.what, s.want), func() bool { return marks.Load() >= s.want })
		if got := marks.Load(); got != s.want {
			t.Errorf("%s: onMark called %d times, want %d", s.what, got, s.want)
		}
	}
}

// Out of the notification group the monitor hears nothing: a change to
// the watched table then goes unseen (what nft's committer.rejoin makes up
// for with the ruleset generation). Back in, it hears changes again.
func TestKernelMonitorSetMember(t *testing.T) {
	ns, k := watchTestTable(t, MonitorRcvBuf, nil)
	if err := k.mon.SetMember(false); err != nil {
		t.Fatal(err)
	}
	testns.NFT(t, ns, "add", "rule", "ip", "t", "c", "drop")
	if marked, all := k.mon.Take(); len(marked) > 0 || all {
		t.Errorf("out of the group, a change marked %v (all: %v)", marked, all)
	}
	if err := k.mon.SetMember(true); err != nil {
		t.Fatal(err)
	}
	testns.NFT(t, ns, "add", "rule", "ip", "t", "d", "drop")
	if marked, _ := k.mon.Take(); !marked[TableRef{IPv4, "t"}] {
		t.Errorf("back in the group, a change marked %v", marked)
	}
}
