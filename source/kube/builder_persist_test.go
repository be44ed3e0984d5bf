package kube

import (
	"maps"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// stateEntries copies a State's maps, to compare a snapshot with itself
// later (values compared as they are: pointers and slices).
type stateEntries struct {
	services  map[model.ServicePortName]*model.ServicePort
	endpoints map[model.ServicePortName][]model.Endpoint
}

func entriesOf(st *model.State) stateEntries {
	return stateEntries{maps.Collect(st.Services.All()), maps.Collect(st.Endpoints.All())}
}

func (e stateEntries) equal(o stateEntries) bool {
	return maps.Equal(e.services, o.services) &&
		maps.EqualFunc(e.endpoints, o.endpoints, func(a, b []model.Endpoint) bool {
			return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) && model.EndpointsEqual(a, b)
		})
}

// Snapshots share the Builder's maps' structure, and none of them sees
// what the Builder did after it was taken: at a size where they share
// deep subtrees, every earlier snapshot still holds exactly what it held,
// through slice changes, Service changes, deletions and additions.
func TestBuilderSnapshotsStayImmutableAtScale(t *testing.T) {
	const n = 3000
	b := NewBuilder("node-1")
	for i := range n {
		if err := b.UpsertService(benchService(i)); err != nil {
			t.Fatal(err)
		}
		if err := b.UpsertEndpointSlice(benchSlice(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	type snap struct {
		st   *model.State
		want stateEntries
	}
	var snaps []snap
	take := func() {
		st := b.State()
		snaps = append(snaps, snap{st, entriesOf(st)})
	}
	take()
	for round := 1; round <= 20; round++ {
		for j := range 50 {
			i := (round*50 + j) * 7 % n
			switch j % 4 {
			case 0:
				if err := b.UpsertEndpointSlice(benchSlice(i, round)); err != nil {
					t.Fatal(err)
				}
			case 1:
				svc := benchService(i)
				svc.Spec.Ports[0].Port = int32(1000 + round)
				if err := b.UpsertService(svc); err != nil {
					t.Fatal(err)
				}
			case 2:
				b.DeleteService("bench", benchService(i).Name)
			default:
				if err := b.UpsertService(benchService(n + round*50 + j)); err != nil {
					t.Fatal(err)
				}
			}
		}
		take()
	}
	for i, s := range snaps {
		if got := entriesOf(s.st); !got.equal(s.want) {
			t.Fatalf("snapshot %d changed after it was taken", i)
		}
	}
	if first, last := snaps[0].st, snaps[len(snaps)-1].st; first.Services.Len() == last.Services.Len() && entriesOf(first).equal(entriesOf(last)) {
		t.Fatal("the changes changed nothing: the test tests nothing")
	}
}
