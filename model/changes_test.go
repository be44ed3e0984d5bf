package model

import (
	"net/netip"
	"slices"
	"testing"
)

func trackerState(lin *Lineage, gen uint64, ports map[string]uint16) *State {
	st := NewState()
	for name, port := range ports {
		n := ServicePortName{Namespace: "ns", Name: name}
		st.Services = st.Services.With(n, &ServicePort{Name: n, Protocol: TCP, Port: port, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}})
		st.Endpoints = st.Endpoints.With(n, []Endpoint{{Addr: netip.MustParseAddr("10.244.0.1"), Port: port, Ready: true}})
	}
	st.Changes = StateChanges{Lineage: lin, Gen: gen}
	return st
}

func names(ns ...string) []ServicePortName {
	var out []ServicePortName
	for _, n := range ns {
		out = append(out, ServicePortName{Namespace: "ns", Name: n})
	}
	return out
}

// The tracker lists added, changed and removed service ports, whichever
// way it learns of them: the Changes, the same State, or a comparison.
func TestChangeTracker(t *testing.T) {
	lin := &Lineage{}
	base := trackerState(lin, 1, map[string]uint16{"a": 80, "b": 81, "c": 82})
	tests := []struct {
		name string
		next func() *State
		want []ServicePortName
	}{
		{"same State", func() *State { return base }, nil},
		{"equal values, new objects, no changes named", func() *State {
			return trackerState(nil, 0, map[string]uint16{"a": 80, "b": 81, "c": 82})
		}, nil},
		{"changed, added and removed, compared", func() *State {
			return trackerState(nil, 0, map[string]uint16{"a": 80, "b": 90, "d": 83})
		}, names("b", "c", "d")},
		{"changes list a change twice and an unknown removal", func() *State {
			st := trackerState(lin, 2, map[string]uint16{"a": 80, "b": 90, "c": 82})
			st.Changes.Ports = names("b", "b", "zz")
			return st
		}, names("b")},
		{"changes listing an unchanged port", func() *State {
			st := trackerState(lin, 2, map[string]uint16{"a": 80, "b": 81, "c": 82})
			st.Changes.Ports = names("a")
			return st
		}, nil},
		{"changes that skip a State generation are compared", func() *State {
			st := trackerState(lin, 3, map[string]uint16{"a": 80, "b": 81})
			st.Changes.Ports = names("a")
			return st
		}, names("c")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr ChangeTracker
			tr.RecordAll(base)
			next := tt.next()
			got := tr.Changes(next)
			slices.SortFunc(got, ServicePortName.Compare)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Changes = %v, want %v", got, tt.want)
			}
			tr.Record(next, got)
			if again := tr.Changes(next); len(again) != 0 {
				t.Errorf("after Record, the same State still has changes %v", again)
			}
		})
	}
}

func TestChangeTrackerEmpty(t *testing.T) {
	var tr ChangeTracker
	st := trackerState(nil, 0, map[string]uint16{"a": 80})
	if got := tr.Changes(st); !slices.Equal(got, names("a")) {
		t.Errorf("nothing recorded: Changes = %v, want every service port", got)
	}
	tr.Record(st, tr.Changes(st))
	if !tr.Recorded(names("a")[0]) {
		t.Errorf("Record on an empty tracker did not record the State")
	}
	tr.Reset()
	if tr.Recorded(names("a")[0]) {
		t.Errorf("Reset kept a service port")
	}
}
