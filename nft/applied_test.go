package nft

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// The backend keeps no fragment of what it applied, and the tables it
// rebuilds from the recorded State are what the kernel holds: after a full
// sync, a change (to the delta table), a removal and an addition, and the
// fold. A drift check compares the kernel with those rebuilt tables, so
// it still finds a fragment's chain emptied behind our back.
func TestKernelAppliedRebuilt(t *testing.T) {
	ns := testns.New(t, "knp-applied-")
	b := openTestBackend(t, ns, demoConfig())
	steps := []struct {
		what  string
		eps   map[string]string
		delta int // service ports in the delta tables after the sync
	}{
		{"full sync", map[string]string{"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}, 0},
		{"a's endpoint moves", map[string]string{"a": "10.0.0.9", "b": "10.0.0.2", "c": "10.0.0.3"}, 1},
		{"c goes, d comes", map[string]string{"a": "10.0.0.9", "b": "10.0.0.2", "d": "10.0.0.4"}, 2},
		{"nothing changes: the fold", map[string]string{"a": "10.0.0.9", "b": "10.0.0.2", "d": "10.0.0.4"}, 0},
		{"b's endpoint moves", map[string]string{"a": "10.0.0.9", "b": "10.0.0.8", "d": "10.0.0.4"}, 1},
	}
	for _, s := range steps {
		if _, err := b.Sync(context.Background(), tinyState(s.eps)); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		for id, tb := range b.applied {
			if len(tb.Fragments) > 0 {
				t.Errorf("%s: the backend keeps %d fragments of %v %s", s.what, len(tb.Fragments), id.f, tb.Name)
			}
		}
		if len(b.inDelta) != s.delta {
			t.Errorf("%s: %d service ports in the delta, want %d", s.what, len(b.inDelta), s.delta)
		}
		n := 0
		for _, tb := range b.appliedTables(tableIDs()) {
			for key := range tb.Fragments {
				if !strings.HasPrefix(key, clusterIPKeyPrefix) { // service ports' only
					n++
				}
			}
		}
		if n != len(s.eps) {
			t.Errorf("%s: %d fragments rebuilt, want %d", s.what, n, len(s.eps))
		}
		// Every table read back and compared (no monitor), flushed
		// chains awaiting deletion allowed for.
		if b.drifted() {
			t.Errorf("%s: a drift check found differences in our own tables", s.what)
		}
	}

	// Behind our back: the delta's KUBE-SEP chain of b loses its rules.
	delta := tableID{nftlib.IPv4, DeltaTable}
	fr := b.appliedTables([]tableID{delta})[delta].Fragments[fragmentKey(proxierName("ns", "b", "p"))]
	if fr == nil {
		t.Fatal("no fragment of ns/b:p in the delta table")
	}
	sep := fr.Chains[len(fr.Chains)-1].Name
	kt := b.k.NewTx()
	kt.FlushChain(nftlib.IPv4, b.applied[delta].Name, sep)
	if err := b.k.CommitTx(kt); err != nil {
		t.Fatal(err)
	}
	if !b.drifted() {
		t.Errorf("a drift check did not find %s emptied", sep)
	}
}

// A large transaction's rules are dropped from the sync's tables as they
// are encoded, a round at a time (here three rules a round): the kernel
// still gets all of them, the applied tables (fixed chains included) are
// still what it holds, and the syncs after it diff against them.
func TestKernelLargeTxReleasesRules(t *testing.T) {
	ns := testns.New(t, "knp-release-")
	large, rounds := 0, 0
	// The full sync (over a hundred rules) is large; the change after it
	// (a handful) is small, as in the proxy.
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), Strategy: Strategy{LargeTxRules: 20, LargeTxRound: 3,
		OnLargeTx: func() func() { large++; return func() {} }, OnLargeTxRound: func() { rounds++ }}})
	eps := map[string]string{"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
	res, err := b.Sync(context.Background(), tinyState(eps))
	if err != nil {
		t.Fatal(err)
	}
	if rules := res.Messages; large != 1 || rounds < 2 {
		t.Errorf("%d large transactions, %d rounds for a full sync of %d messages, want one, several", large, rounds, rules)
	}
	if b.drifted() {
		t.Error("after a full sync that released its rules, a drift check found differences")
	}
	eps["b"] = "10.0.0.7"
	if _, err := b.Sync(context.Background(), tinyState(eps)); err != nil || large != 1 {
		t.Fatalf("the change: err %v, %d large transactions in all, want the full sync's only", err, large)
	}
	if b.drifted() {
		t.Error("after a change, a drift check found differences")
	}
}

// A large full sync the kernel refuses, after its rules were let go, leaves
// nothing behind that the next sync depends on: that one (full again)
// writes everything, and a change after it diffs against what it applied.
func TestLargeTxRefusedThenRetried(t *testing.T) {
	rounds := 0
	b, k, _ := fakeBackend(t, BackendConfig{Strategy: Strategy{LargeTxRules: 1, LargeTxRound: 2,
		OnLargeTx: func() func() { return func() {} }, OnLargeTxRound: func() { rounds++ }}})
	refuse := true
	k.SetRefuse(func(op string) error {
		if refuse && strings.HasPrefix(op, "add rule") {
			refuse = false
			return syscall.ENOSPC
		}
		return nil
	})
	eps := map[string]string{"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
	if _, err := b.Sync(t.Context(), tinyState(eps)); err == nil {
		t.Fatal("the refused full sync reported no error")
	}
	if rounds == 0 {
		t.Fatal("the refused full sync let go of no round")
	}
	res, err := b.Sync(t.Context(), tinyState(eps))
	if err != nil || !res.Full {
		t.Fatalf("the sync after the refusal: full=%v, err %v; want a full one", res.Full, err)
	}
	holdsFullSync(t, k, tinyState(eps), b.cfg)
	eps["a"] = "10.0.0.9"
	if _, err := b.Sync(t.Context(), tinyState(eps)); err != nil {
		t.Fatal(err)
	}
	if !b.inDelta[proxierName("ns", "a", "p")] {
		t.Error("the change did not go to the delta table")
	}
	if b.drifted() { // the fake kernel's tables compared with the rebuilt ones
		t.Errorf("after the change the kernel differs from the applied tables:\n%s", k.String())
	}
}
