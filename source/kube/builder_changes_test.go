package kube

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// changesStart is when the Builders of the change tests start.
var changesStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// changeSlice is IPv4 EndpointSlice name of Service svc with one endpoint
// addr on port "http", and the trigger-time annotation at trigger
// (none when zero).
func changeSlice(name, svc, addr string, trigger time.Time) *discoveryv1.EndpointSlice {
	port, proto := int32(8080), corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: &port, Protocol: &proto}},
	}
	if !trigger.IsZero() {
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	}
	return es
}

func withSlice(es *discoveryv1.EndpointSlice, f func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	es = es.DeepCopy()
	f(es)
	return es
}

// TestBuilderEndpointChanges checks the EndpointSlice side of the change
// metrics against kube-proxy's rules: every event of an IPv4/IPv6 slice
// naming its Service counts in the total; those that change the slice are
// pending until the next snapshot; each such update hands out its trigger
// time if it has one from after the Builder started, several per Service
// included; a deletion drops the Service's trigger times collected so far.
func TestBuilderEndpointChanges(t *testing.T) {
	t0, t1, t2, t3 := changesStart.Add(time.Second), changesStart.Add(2*time.Second), changesStart.Add(3*time.Second), changesStart.Add(4*time.Second)
	a := changeSlice("web-a", "web", "10.0.0.1", t0)
	snapshot := func(b *Builder) { b.StateWithTriggers() }
	tests := []struct {
		name     string
		do       []func(b *Builder)
		total    uint64
		pending  int
		triggers []time.Time
	}{{
		name:  "nothing",
		total: 0, pending: 0,
	}, {
		name:  "one new slice",
		do:    []func(*Builder){func(b *Builder) { _ = b.UpsertEndpointSlice(a) }},
		total: 1, pending: 1, triggers: []time.Time{t0},
	}, {
		name: "add then update: both trigger times",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.9", t1)) },
		},
		total: 2, pending: 2, triggers: []time.Time{t0, t1},
	}, {
		name: "two slices of a Service, one updated; another Service",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.1", t1)) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-b", "web", "10.0.0.2", t2)) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.3", t3)) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("db-a", "db", "10.0.0.4", t0)) },
		},
		total: 4, pending: 4, triggers: []time.Time{t0, t1, t2, t3},
	}, {
		name: "the same slice again (a resync) is counted, not pending, no trigger time",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(a.DeepCopy()) },
		},
		total: 2, pending: 1, triggers: []time.Time{t0},
	}, {
		name:  "no annotation: pending, no trigger time",
		do:    []func(*Builder){func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.1", time.Time{})) }},
		total: 1, pending: 1,
	}, {
		name: "an unparsable annotation is ignored",
		do: []func(*Builder){func(b *Builder) {
			_ = b.UpsertEndpointSlice(withSlice(a, func(es *discoveryv1.EndpointSlice) {
				es.Annotations[corev1.EndpointsLastChangeTriggerTime] = "yesterday"
			}))
		}},
		total: 1, pending: 1,
	}, {
		name: "a trigger time from before the Builder started is ignored",
		do: []func(*Builder){func(b *Builder) {
			_ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.1", changesStart.Add(-time.Second)))
		}},
		total: 1, pending: 1,
	}, {
		name: "add then delete: nothing to measure",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { b.DeleteEndpointSlice("default", "web-a") },
		},
		total: 2, pending: 2,
	}, {
		name: "a deletion drops the trigger times of the Service's other slices too, not other Services'",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-b", "web", "10.0.0.2", t1)) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("db-a", "db", "10.0.0.3", t2)) },
			func(b *Builder) { b.RemoveEndpointSlice(a) },
		},
		total: 4, pending: 4, triggers: []time.Time{t2},
	}, {
		name: "add, delete, add again: the last trigger time",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { b.RemoveEndpointSlice(a) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.1", t2)) },
		},
		total: 3, pending: 3, triggers: []time.Time{t2},
	}, {
		name: "deleting a slice never seen: counted with the object, not pending",
		do: []func(*Builder){
			func(b *Builder) { b.RemoveEndpointSlice(a) },
			func(b *Builder) { b.DeleteEndpointSlice("default", "web-z") }, // no object: not counted
		},
		total: 1, pending: 0,
	}, {
		name: "slices kube-proxy does not track are not counted",
		do: []func(*Builder){
			func(b *Builder) {
				_ = b.UpsertEndpointSlice(withSlice(a, func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }))
			},
			func(b *Builder) {
				_ = b.UpsertEndpointSlice(withSlice(a, func(es *discoveryv1.EndpointSlice) { es.Labels = nil }))
			},
			func(b *Builder) {
				_ = b.UpsertEndpointSlice(withSlice(a, func(es *discoveryv1.EndpointSlice) { es.Labels[LabelHeadless] = "" }))
			},
			func(b *Builder) {
				b.RemoveEndpointSlice(withSlice(a, func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }))
			},
		},
		total: 0, pending: 0,
	}, {
		name: "a snapshot takes the pending changes and their trigger times",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			snapshot,
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-a", "web", "10.0.0.2", t1)) },
		},
		total: 2, pending: 1, triggers: []time.Time{t1},
	}, {
		name: "a deletion after a snapshot drops only what came since",
		do: []func(*Builder){
			func(b *Builder) { _ = b.UpsertEndpointSlice(a) },
			func(b *Builder) { _ = b.UpsertEndpointSlice(changeSlice("web-b", "web", "10.0.0.2", t1)) },
			snapshot,
			func(b *Builder) { b.DeleteEndpointSlice("default", "web-b") },
		},
		total: 3, pending: 1,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuilder("node-1")
			b.started = changesStart
			for _, f := range tc.do {
				f(b)
			}
			c := b.ChangeCounts()
			if c.EndpointChanges != tc.total || c.EndpointChangesPending != tc.pending {
				t.Errorf("endpoint changes total %d, pending %d; want %d, %d", c.EndpointChanges, c.EndpointChangesPending, tc.total, tc.pending)
			}
			if c.ServiceChanges != 0 || c.ServicesPending != 0 {
				t.Errorf("service changes counted for slice events: %+v", c)
			}
			_, got := b.StateWithTriggers()
			slices.SortFunc(got, time.Time.Compare)
			if !slices.EqualFunc(got, tc.triggers, time.Time.Equal) {
				t.Errorf("trigger times %v, want %v", got, tc.triggers)
			}
			after := b.ChangeCounts()
			if after.EndpointChangesPending != 0 || after.EndpointChanges != tc.total {
				t.Errorf("after the snapshot: %+v, want nothing pending and the total kept", after)
			}
			if _, again := b.StateWithTriggers(); len(again) != 0 {
				t.Errorf("trigger times handed out twice: %v", again)
			}
		})
	}
}

// TestBuilderServiceChanges checks the Service side: every event counts in
// the total; a Service is pending while it differs from what the last
// snapshot had, so changes that cancel out leave nothing pending.
func TestBuilderServiceChanges(t *testing.T) {
	web := csvc("web", 0, "10.96.0.10")
	web81 := csvc("web", 0, "10.96.0.10", withPorts(corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 81}))
	db := csvc("db", 0, "10.96.0.11")
	headless := csvc("hl", 0, "None")
	add := func(s *corev1.Service) func(*Builder) { return func(b *Builder) { _ = b.UpsertService(s) } }
	del := func(name string) func(*Builder) { return func(b *Builder) { b.DeleteService("default", name) } }
	snapshot := func(b *Builder) { b.State() }
	tests := []struct {
		name    string
		do      []func(*Builder)
		total   uint64
		pending int
	}{
		{"nothing", nil, 0, 0},
		{"one new Service", []func(*Builder){add(web)}, 1, 1},
		{"two Services", []func(*Builder){add(web), add(db)}, 2, 2},
		{"a Service changed twice is one pending", []func(*Builder){add(web), add(web81)}, 2, 1},
		{"a resync is counted, not pending", []func(*Builder){add(web), snapshot, add(web.DeepCopy())}, 2, 0},
		{"added then deleted: cancels out", []func(*Builder){add(web), del("web")}, 2, 0},
		{"changed and changed back: cancels out", []func(*Builder){add(web), snapshot, add(web81), add(web)}, 3, 0},
		{"changed after a snapshot", []func(*Builder){add(web), snapshot, add(web81)}, 2, 1},
		{"deleted after a snapshot", []func(*Builder){add(web), add(db), snapshot, del("web")}, 3, 1},
		{"deleting an unknown Service counts, pends nothing", []func(*Builder){del("nope")}, 1, 0},
		{"a Service the proxy ignores (headless) counts, pends nothing", []func(*Builder){add(headless)}, 1, 0},
		{"becoming headless is a change", []func(*Builder){add(web), snapshot, add(csvc("web", 0, "None"))}, 2, 1},
		{"a nil Service is no event", []func(*Builder){func(b *Builder) { _ = b.UpsertService(nil) }}, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuilder("node-1")
			for _, f := range tc.do {
				f(b)
			}
			want := model.ChangeCounts{ServiceChanges: tc.total, ServicesPending: tc.pending}
			if got := b.ChangeCounts(); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
			b.State()
			want.ServicesPending = 0
			if got := b.ChangeCounts(); got != want {
				t.Errorf("after a snapshot: got %+v, want %+v", got, want)
			}
		})
	}
}
