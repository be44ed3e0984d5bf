package kube

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

func sliceYAML(name, service, addr string) string {
	return `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ` + name + `
  namespace: default
  labels: {kubernetes.io/service-name: ` + service + `}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [` + addr + `], nodeName: node-1}]`
}

// TestBuilder walks one Builder through a sequence of changes and checks
// the snapshot after each, as a watch source would drive it.
func TestBuilder(t *testing.T) {
	b := NewBuilder("node-1")
	web := sourcetest.DecodeService(t, sourcetest.WebService)
	sliceA := sourcetest.DecodeSlices(t, sliceYAML("web-a", "web", "10.0.0.1"))[0]
	sliceB := sourcetest.DecodeSlices(t, sliceYAML("web-b", "web", "10.0.0.2"))[0]
	http := sourcetest.WebPortName("http")

	type want struct {
		services  []model.ServicePortName
		endpoints map[model.ServicePortName][]model.Endpoint
		node      model.Node
		errs      []string
	}
	none := map[model.ServicePortName][]model.Endpoint{}
	steps := []struct {
		name string
		do   func() error
		want want
	}{{
		name: "empty",
		do:   func() error { return nil },
		want: want{endpoints: none, node: model.Node{Name: "node-1"}},
	}, {
		name: "a slice before its Service is kept but not shown",
		do:   func() error { return b.UpsertEndpointSlice(sliceA) },
		want: want{endpoints: none, node: model.Node{Name: "node-1"}},
	}, {
		name: "the Service arrives",
		do:   func() error { return b.UpsertService(web) },
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
			node:      model.Node{Name: "node-1"}},
	}, {
		name: "a second slice",
		do:   func() error { return b.UpsertEndpointSlice(sliceB) },
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080), sourcetest.ReadyEndpoint("10.0.0.2", 8080)}},
			node:      model.Node{Name: "node-1"}},
	}, {
		name: "a slice moves to another Service",
		do: func() error {
			return b.UpsertEndpointSlice(sourcetest.DecodeSlices(t, sliceYAML("web-b", "other", "10.0.0.2"))[0])
		},
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
			node:      model.Node{Name: "node-1"}},
	}, {
		name: "renumbering the Service's port keeps its endpoints",
		do: func() error {
			renumbered := web.DeepCopy()
			renumbered.Spec.Ports[0].Port = 81
			if err := b.UpsertService(renumbered); err != nil {
				return err
			}
			if p := b.State().Services.Get(http).Port; p != 81 {
				t.Errorf("port = %d after renumbering, want 81", p)
			}
			return b.UpsertService(web)
		},
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
			node:      model.Node{Name: "node-1"}},
	}, {
		name: "another node's Node is ignored, ours is used",
		do: func() error {
			if err := b.UpsertNode(&corev1.Node{ObjectMeta: metaName("node-2")}); err != nil {
				return err
			}
			n := &corev1.Node{ObjectMeta: metaName("node-1")}
			n.Labels = map[string]string{corev1.LabelTopologyZone: "zone-a"}
			return b.UpsertNode(n)
		},
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
			node:      model.Node{Name: "node-1", Zone: "zone-a"}},
	}, {
		name: "an invalid update removes the Service and is reported",
		do: func() error {
			bad := web.DeepCopy()
			bad.Spec.ClusterIP = "nope"
			return b.UpsertService(bad)
		},
		want: want{endpoints: none, node: model.Node{Name: "node-1", Zone: "zone-a"},
			errs: []string{`service default/web: spec.clusterIPs[0]: invalid IP address "nope", service skipped`}},
	}, {
		name: "fixing it clears the error",
		do:   func() error { return b.UpsertService(web) },
		want: want{services: []model.ServicePortName{http},
			endpoints: map[model.ServicePortName][]model.Endpoint{http: {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
			node:      model.Node{Name: "node-1", Zone: "zone-a"}},
	}, {
		name: "a label handing the Service to another proxy removes it",
		do: func() error {
			other := web.DeepCopy()
			other.Labels = map[string]string{LabelServiceProxyName: "x"}
			return b.UpsertService(other)
		},
		want: want{endpoints: none, node: model.Node{Name: "node-1", Zone: "zone-a"}},
	}, {
		name: "back again, then its last slice goes",
		do: func() error {
			b.DeleteEndpointSlice("default", "web-a")
			return b.UpsertService(web)
		},
		want: want{services: []model.ServicePortName{http}, endpoints: none,
			node: model.Node{Name: "node-1", Zone: "zone-a"}},
	}, {
		name: "deletes",
		do: func() error {
			b.DeleteService("default", "web")
			b.DeleteNode("node-1")
			return nil
		},
		want: want{endpoints: none, node: model.Node{Name: "node-1"}},
	}}
	for _, s := range steps {
		err := s.do()
		sourcetest.CheckErrors(t, SplitErrors(err), s.want.errs...)
		sourcetest.CheckErrors(t, b.Errors(), s.want.errs...)
		st := b.State()
		sourcetest.MustEqual(t, s.name+": services", st.SortedNames(), orEmpty(s.want.services))
		sourcetest.MustEqualEntries(t, s.name+": endpoints", st.Endpoints, s.want.endpoints)
		sourcetest.MustEqual(t, s.name+": node", st.Node, s.want.node)
		for _, n := range st.SortedNames() {
			if st.Services.Get(n).Name != n {
				t.Errorf("%s: service %v filed under %v", s.name, st.Services.Get(n).Name, n)
			}
		}
	}
}

func orEmpty(n []model.ServicePortName) []model.ServicePortName {
	if n == nil {
		return []model.ServicePortName{}
	}
	return n
}

// TestBuilderSnapshotsAreIndependent: a State handed to a backend must not
// change when the Builder moves on.
func TestBuilderSnapshotsAreIndependent(t *testing.T) {
	b := NewBuilder("node-1")
	if err := b.UpsertService(sourcetest.DecodeService(t, sourcetest.WebService)); err != nil {
		t.Fatal(err)
	}
	if err := b.UpsertEndpointSlice(sourcetest.DecodeSlices(t, sliceYAML("web-a", "web", "10.0.0.1"))[0]); err != nil {
		t.Fatal(err)
	}
	before := b.State()
	if again := b.State(); again != before {
		t.Error("nothing changed, yet State built a new snapshot")
	}
	if err := b.UpsertEndpointSlice(sourcetest.DecodeSlices(t, sliceYAML("web-a", "web", "10.0.0.7"))[0]); err != nil {
		t.Fatal(err)
	}
	b.DeleteService("default", "web")
	sourcetest.MustEqualEntries(t, "old snapshot endpoints", before.Endpoints,
		map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}})
	if before.Services.Len() != 1 {
		t.Errorf("old snapshot lost its service: %v", before.Services)
	}
}

// TestBuilderNilObjects: handlers may see nil from a tombstone; no panic.
func TestBuilderNilObjects(t *testing.T) {
	b := NewBuilder("node-1")
	var svc *corev1.Service
	var es *discoveryv1.EndpointSlice
	if err := b.UpsertService(svc); err != nil {
		t.Error(err)
	}
	if err := b.UpsertEndpointSlice(es); err != nil {
		t.Error(err)
	}
	if err := b.UpsertNode(nil); err != nil {
		t.Error(err)
	}
}

func metaName(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

// TestBuilderConcurrent runs handlers and snapshot takers at once, for the
// race detector: State and Errors update the Builder's caches too.
func TestBuilderConcurrent(t *testing.T) {
	b := NewBuilder("node-1")
	// Decoded here: decodeSlices may call t.Fatal, which only this goroutine may.
	sliceObjs := make([]*discoveryv1.EndpointSlice, 10)
	for i := range sliceObjs {
		name := fmt.Sprintf("s%d", i)
		sliceObjs[i] = sourcetest.DecodeSlices(t, sliceYAML(name+"-a", name, fmt.Sprintf("10.0.0.%d", i+1)))[0]
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				n := (w*7 + i) % 10
				name := fmt.Sprintf("s%d", n)
				if i%5 == 4 {
					b.DeleteService("default", name)
				} else {
					_ = b.UpsertService(csvc(name, i%3, fmt.Sprintf("10.96.0.%d", 10+i%10), nodePort(int32(30080+i%2))))
				}
				if i%3 == 2 {
					b.DeleteEndpointSlice("default", name+"-a")
				} else {
					_ = b.UpsertEndpointSlice(sliceObjs[n])
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			sourcetest.CheckUniqueKeys(t, "concurrent", b.State())
			_ = b.Errors()
		}
	})
	wg.Wait()
	sourcetest.CheckUniqueKeys(t, "concurrent, at the end", b.State())
}

// Each new snapshot says which service ports changed since the one before,
// so that backends can look at those alone.
func TestBuilderStateChanges(t *testing.T) {
	b := NewBuilder("node-1")
	if err := b.UpsertService(sourcetest.DecodeService(t, sourcetest.WebService)); err != nil {
		t.Fatal(err)
	}
	first := b.State()
	if d := first.Changes; d.Lineage == nil || d.Gen != 1 || !d.NodeChanged {
		t.Fatalf("first snapshot's changes: %+v, want generation 1 with the node changed (nothing before)", d)
	}
	if again := b.State(); again.Changes.Gen != 1 {
		t.Errorf("the same snapshot again has generation %d", again.Changes.Gen)
	}
	if err := b.UpsertEndpointSlice(sourcetest.DecodeSlices(t, sliceYAML("web-a", "web", "10.0.0.1"))[0]); err != nil {
		t.Fatal(err)
	}
	second := b.State()
	d := second.Changes
	if !d.Follows(first.Changes.Lineage, 1) || !slices.Contains(d.Ports, sourcetest.WebPortName("http")) {
		t.Errorf("after a slice change: %+v, want generation 2 following 1 with %s changed", d, sourcetest.WebPortName("http"))
	}
	b.DeleteService("default", "web")
	third := b.State()
	if !third.Changes.Follows(d.Lineage, 2) || !slices.Contains(third.Changes.Ports, sourcetest.WebPortName("http")) || third.Services.Len() != 0 {
		t.Errorf("after the Service went: %+v", third.Changes)
	}
	if other := NewBuilder("node-1"); other.State().Changes.Follows(d.Lineage, 3) {
		t.Error("another Builder's snapshot follows this one's")
	}
}
