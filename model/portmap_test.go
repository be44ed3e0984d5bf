package model

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

func pmKey(i int) ServicePortName {
	return ServicePortName{Namespace: fmt.Sprintf("ns-%d", i%7), Name: fmt.Sprintf("svc-%d", i), Port: "p"}
}

// checkPortMap fails unless m holds exactly want.
func checkPortMap(t *testing.T, m PortMap[int], want map[ServicePortName]int) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", m.Len(), len(want))
	}
	got := maps.Collect(m.All())
	if !maps.Equal(got, want) {
		t.Fatalf("All yields %d entries, want %d (maps differ)", len(got), len(want))
	}
	for k, v := range want {
		if g, ok := m.Lookup(k); !ok || g != v {
			t.Fatalf("Lookup(%v) = %d, %v; want %d", k, g, ok, v)
		}
	}
	if _, ok := m.Lookup(ServicePortName{Name: "absent"}); ok {
		t.Fatal("Lookup found an absent key")
	}
	if !slices.IsSortedFunc(m.SortedKeys(), ServicePortName.Compare) || len(m.SortedKeys()) != len(want) {
		t.Fatal("SortedKeys is not the sorted keys")
	}
}

// TestPortMapMatchesGoMap applies random sets and deletes to a PortMap
// and a Go map, taking snapshots along the way: each snapshot must still
// hold what it held when taken, however the editor went on.
func TestPortMapMatchesGoMap(t *testing.T) {
	for _, size := range []int{1, 10, 100, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(size)))
			var e PortMapEditor[int]
			want := map[ServicePortName]int{}
			type snap struct {
				m    PortMap[int]
				want map[ServicePortName]int
			}
			var snaps []snap
			for step := range 20 * size {
				k := pmKey(rng.IntN(size))
				if rng.IntN(3) == 0 {
					e.Delete(k)
					delete(want, k)
				} else {
					e.Set(k, step)
					want[k] = step
				}
				if rng.IntN(size) == 0 {
					snaps = append(snaps, snap{e.Map(), maps.Clone(want)})
				}
			}
			checkPortMap(t, e.Map(), want)
			for _, s := range snaps {
				checkPortMap(t, s.m, s.want)
			}
		})
	}
}

// TestPortMapSnapshotImmutable: a map handed out never changes, by edits
// of its editor or of editors started from it.
func TestPortMapSnapshotImmutable(t *testing.T) {
	var e PortMapEditor[int]
	for i := range 1000 {
		e.Set(pmKey(i), i)
	}
	old := e.Map()
	want := maps.Collect(old.All())
	other := old.Edit()
	for i := range 1000 {
		e.Set(pmKey(i), -i)
		other.Delete(pmKey(i))
		e.Set(pmKey(1000+i), i)
	}
	_ = old.With(pmKey(5), 99).Without(pmKey(6))
	checkPortMap(t, old, want)
	if other.Len() != 0 || e.Len() != 2000 {
		t.Fatalf("editors hold %d and %d entries, want 0 and 2000", other.Len(), e.Len())
	}
}

// TestDiffKeys compares DiffKeys with a comparison of every key, for maps
// derived from each other and built apart.
func TestDiffKeys(t *testing.T) {
	var e PortMapEditor[int]
	for i := range 3000 {
		e.Set(pmKey(i), i)
	}
	base := e.Map()
	rng := rand.New(rand.NewPCG(2, 3))
	for range 50 {
		d := base.Edit()
		for range rng.IntN(20) {
			k := pmKey(rng.IntN(3100))
			switch rng.IntN(3) {
			case 0:
				d.Delete(k)
			case 1:
				d.Set(k, rng.IntN(5))
			default:
				d.Set(k, d.Get(k)) // an equal value: no difference
			}
		}
		derived := d.Map()
		apart := PortMapFrom(maps.Collect(derived.All()))
		for _, other := range []PortMap[int]{derived, apart} {
			want := bruteDiff(base, other)
			got := slices.Collect(DiffKeys(base, other, func(x, y int) bool { return x == y }))
			slices.SortFunc(got, ServicePortName.Compare)
			if !slices.Equal(got, want) {
				t.Fatalf("DiffKeys = %v, want %v", got, want)
			}
		}
	}
	if n := len(slices.Collect(DiffKeys(PortMap[int]{}, base, func(x, y int) bool { return x == y }))); n != base.Len() {
		t.Fatalf("DiffKeys from empty yields %d keys, want %d", n, base.Len())
	}
}

// bruteDiff compares every entry (through Go maps: the maps' own
// lookups may use forced hashes).
func bruteDiff(x, y PortMap[int]) []ServicePortName {
	a, b := maps.Collect(x.All()), maps.Collect(y.All())
	var out []ServicePortName
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, ServicePortName.Compare)
	return out
}

// Keys whose hashes collide (all 64 bits, or the first levels only) live
// in collision lists or deep paths: sets, deletes, lookups, iteration and
// DiffKeys still behave as a Go map's, and snapshots stay as they were.
func TestPortMapCollisions(t *testing.T) {
	// Four hashes: two equal in full, one sharing their first 60 bits,
	// one apart.
	hashes := []uint64{0xabcdef, 0xabcdef, 0xabcdef | 1<<62, 0x123}
	hashOf := func(i int) uint64 { return hashes[i%len(hashes)] }
	rng := rand.New(rand.NewPCG(5, 6))
	var e PortMapEditor[int]
	want := map[ServicePortName]int{}
	var snaps []PortMap[int]
	var wants []map[ServicePortName]int
	for step := range 4000 {
		i := rng.IntN(24)
		k := pmKey(i)
		if rng.IntN(3) == 0 {
			e.deleteHashed(hashOf(i), k)
			delete(want, k)
		} else {
			e.setHashed(hashOf(i), k, step)
			want[k] = step
		}
		if step%100 == 0 {
			snaps, wants = append(snaps, e.Map()), append(wants, maps.Clone(want))
		}
		m := e.Map()
		if m.Len() != len(want) || !maps.Equal(maps.Collect(m.All()), want) {
			t.Fatalf("step %d: map differs from %v", step, want)
		}
		for j := range 24 {
			v, ok := m.lookup(hashOf(j), pmKey(j))
			if w, wok := want[pmKey(j)]; ok != wok || v != w {
				t.Fatalf("step %d: lookup %d = %d, %v; want %d, %v", step, j, v, ok, w, wok)
			}
		}
	}
	same := func(x, y int) bool { return x == y }
	for i := range snaps {
		if !maps.Equal(maps.Collect(snaps[i].All()), wants[i]) {
			t.Fatalf("snapshot %d changed", i)
		}
		if i > 0 {
			got := slices.SortedFunc(DiffKeys(snaps[i-1], snaps[i], same), ServicePortName.Compare)
			if want := bruteDiff(snaps[i-1], snaps[i]); !slices.Equal(got, want) {
				t.Fatalf("DiffKeys of snapshots %d and %d = %v, want %v", i-1, i, got, want)
			}
		}
	}
}
