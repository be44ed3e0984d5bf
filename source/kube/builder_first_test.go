package kube

import (
	"reflect"
	"testing"
)

// TestBuilderLargeFirstState checks the first snapshot of a large listing:
// it must equal the snapshot of a Builder that took the same objects one
// snapshot at a time, conflicts included.
func TestBuilderLargeFirstState(t *testing.T) {
	const n = 8192
	big, small := NewBuilder("node-1"), NewBuilder("node-1")
	for i := range n {
		svc := benchService(i)
		if i%997 == 0 && i > 0 {
			svc.Spec.Ports[0].NodePort = benchService(i - 1).Spec.Ports[0].NodePort // a conflict
		}
		for _, b := range []*Builder{big, small} {
			if err := b.UpsertService(svc); err != nil {
				t.Fatal(err)
			}
			if err := b.UpsertEndpointSlice(benchSlice(i, 0)); err != nil {
				t.Fatal(err)
			}
		}
		if i%100 == 0 {
			small.State()
		}
	}
	got, want := big.State(), small.State()
	if got.Services.Len() != n || want.Services.Len() != n {
		t.Fatalf("got %d and %d service ports, want %d", got.Services.Len(), want.Services.Len(), n)
	}
	for _, name := range want.Services.SortedKeys() {
		if !got.Services.Get(name).Equal(want.Services.Get(name)) {
			t.Fatalf("%v: got %+v, want %+v", name, got.Services.Get(name), want.Services.Get(name))
		}
		if !reflect.DeepEqual(got.Endpoints.Get(name), want.Endpoints.Get(name)) {
			t.Fatalf("%v: endpoints differ", name)
		}
	}
	if len(big.Errors()) == 0 || len(big.Errors()) != len(small.Errors()) {
		t.Fatalf("errors: got %d, want %d (and some)", len(big.Errors()), len(small.Errors()))
	}
}
