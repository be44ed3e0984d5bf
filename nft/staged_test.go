package nft

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// fiveServices is tinyState with five Services of one endpoint each.
func fiveServices() map[string]string {
	return map[string]string{"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3", "d": "10.0.0.4", "e": "10.0.0.5"}
}

// A large full sync into an empty kernel is staged: several
// transactions, after which the kernel holds what the one transaction
// writes; a change then diffs against it. A full sync over the tables
// it left is one transaction again.
func TestStagedFullSync(t *testing.T) {
	b, k, _ := fakeBackend(t, BackendConfig{Strategy: Strategy{StageRules: 2, StagePieces: 1 << 20}}) // two rules a piece
	eps := fiveServices()
	gen0, _ := k.Generation()
	if _, err := b.Sync(t.Context(), tinyState(eps)); err != nil {
		t.Fatal(err)
	}
	holdsFullSync(t, k, tinyState(eps), b.cfg)
	gen1, _ := k.Generation()
	if gen1-gen0 < 4 { // the table, the fragments (5 x 3 rules, 2 a piece), the rest
		t.Errorf("the first full sync took %d transactions, want it staged", gen1-gen0)
	}
	eps["c"] = "10.0.0.9"
	if _, err := b.Sync(t.Context(), tinyState(eps)); err != nil {
		t.Fatal(err)
	}
	if b.drifted() {
		t.Errorf("after a change the kernel differs from the applied tables:\n%s", k.String())
	}
	b.ForceFull()
	if _, err := b.Sync(t.Context(), tinyState(eps)); err != nil {
		t.Fatal(err)
	}
	if gen2, _ := k.Generation(); gen2 != gen1+2 {
		t.Errorf("a full sync over existing tables took %d transactions (the change's included), want one", gen2-gen1-1)
	}
	if b.drifted() {
		t.Errorf("after the full sync over existing tables the kernel differs from the applied tables:\n%s", k.String())
	}
}

// A staged sync releases (OnLargeTxRound) after every second piece once
// StageReleaseBytes more were sent: small pieces are not worth a
// collection of the heap each.
func TestStagedReleaseEveryBytes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		releaseBytes int
		want         func(releases, pieces int) bool
	}{
		{"every second piece", 1, func(r, p int) bool { return r >= 2 && r <= p/2 }},
		{"pieces smaller than the bytes", 1 << 30, func(r, _ int) bool { return r == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			releases := 0
			b, k, _ := fakeBackend(t, BackendConfig{Strategy: Strategy{StageRules: 2, StagePieces: 1 << 20,
				StageReleaseBytes: tc.releaseBytes, OnLargeTxRound: func() { releases++ }}})
			gen0, _ := k.Generation()
			if _, err := b.Sync(t.Context(), tinyState(fiveServices())); err != nil {
				t.Fatal(err)
			}
			gen1, _ := k.Generation()
			if pieces := int(gen1 - gen0); !tc.want(releases, pieces) {
				t.Errorf("%d releases over %d transactions", releases, pieces)
			}
		})
	}
}

// A staged full sync refused half way leaves chains nothing reaches (no
// base chain, no map element), and the full sync after it writes
// everything.
func TestStagedRefusedThenRetried(t *testing.T) {
	b, k, _ := fakeBackend(t, BackendConfig{Strategy: Strategy{StageRules: 2, StagePieces: 1 << 20}}) // two rules a piece
	rules := 0
	k.SetRefuse(func(op string) error {
		if strings.HasPrefix(op, "add rule") {
			if rules++; rules == 5 { // in the third piece of Service chains
				return syscall.ENOSPC
			}
		}
		return nil
	})
	eps := fiveServices()
	if _, err := b.Sync(t.Context(), tinyState(eps)); err == nil {
		t.Fatal("the refused full sync reported no error")
	}
	held := k.String()
	if !strings.Contains(held, "KUBE-SVC-") {
		t.Fatalf("the pieces before the refused one are not in the kernel:\n%s", held)
	}
	if strings.Contains(held, "hook") || strings.Contains(held, "element") {
		t.Errorf("after a refused staged sync the kernel holds base chains or elements:\n%s", held)
	}
	res, err := b.Sync(t.Context(), tinyState(eps))
	if err != nil || !res.Full {
		t.Fatalf("the sync after the refusal: full=%v, err %v; want a full one", res.Full, err)
	}
	holdsFullSync(t, k, tinyState(eps), b.cfg)
}

// Against the kernel, a staged full sync's transactions follow one
// another (each numbered after the one before, encoded while it
// commits), and the kernel then holds what was applied.
func TestKernelStagedFullSync(t *testing.T) {
	ns := testns.New(t, "knp-staged-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), Strategy: Strategy{StageRules: 3, StagePieces: 1 << 20}})
	eps := fiveServices()
	gen0, err := b.k.Generation()
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Sync(context.Background(), tinyState(eps))
	if err != nil {
		t.Fatal(err)
	}
	if gen1, _ := b.k.Generation(); gen1-gen0 < 4 {
		t.Errorf("the full sync of %d messages took %d transactions, want it staged", res.Messages, gen1-gen0)
	}
	if b.drifted() {
		t.Error("after a staged full sync, a drift check found differences")
	}
	eps["b"] = "10.0.0.7"
	if _, err := b.Sync(context.Background(), tinyState(eps)); err != nil {
		t.Fatal(err)
	}
	if b.drifted() {
		t.Error("after a change, a drift check found differences")
	}
}

// absentKernel is a fake kernel that says it holds no table: as if the
// tables appeared between the plan's look and the sync's read.
type absentKernel struct{ nftlib.FakeKernel }

func (absentKernel) HasTables(_ nftlib.Family, names []string) (map[string]bool, error) {
	return map[string]bool{}, nil
}

// A full sync planned as staged whose tables turn out to exist when it
// reads the kernel is one transaction after all: staged chains would sit
// in live tables that the last transaction flushes.
func TestStagedTablesAppeared(t *testing.T) {
	k := nftlib.NewFakeKernel()
	eps := fiveServices()
	for _, dp := range []nftlib.Dataplane{k, absentKernel{k}} {
		b, err := NewBackend(dp, BackendConfig{Rules: demoConfig(), Strategy: Strategy{StageRules: 2, StagePieces: 1 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		gen0, _ := k.Generation()
		if _, err := b.Sync(t.Context(), tinyState(eps)); err != nil {
			t.Fatal(err)
		}
		if gen1, _ := k.Generation(); dp != nftlib.Dataplane(k) && gen1 != gen0+1 {
			t.Errorf("a full sync over existing tables took %d transactions, want one", gen1-gen0)
		}
		holdsFullSync(t, k, tinyState(eps), b.cfg)
	}
}
