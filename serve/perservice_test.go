package serve

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// randomLineage returns States of one lineage, each from the one before
// by a few random changes (Services with and without Local policies and
// health check node ports, endpoints local or not, ready or not), with
// Changes naming them; every fifth skips a State generation, every seventh
// changes the node, as a consumer that missed States or a Node update
// sees them.
func randomLineage(seed uint64, steps int) []*model.State {
	rng := rand.New(rand.NewPCG(seed, 7))
	lin := &model.Lineage{}
	st := &model.State{Node: model.Node{Name: "node-1"}, Changes: model.StateChanges{Lineage: lin, Gen: 1, NodeChanged: true}}
	out := []*model.State{st}
	for step := range steps {
		next := *st
		next.Changes = model.StateChanges{Lineage: lin, Gen: st.Changes.Gen + 1}
		if step%5 == 4 {
			next.Changes.Gen++
		}
		if step%7 == 6 {
			next.Node = model.Node{Name: fmt.Sprintf("node-%d", 1+rng.IntN(2))}
			next.Changes.NodeChanged = true
		}
		for range 1 + rng.IntN(4) {
			i := rng.IntN(60)
			name := model.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i/2), Port: fmt.Sprint(i % 2)}
			next.Changes.Ports = append(next.Changes.Ports, name)
			if rng.IntN(5) == 0 {
				next.Services, next.Endpoints = next.Services.Without(name), next.Endpoints.Without(name)
				continue
			}
			svc := &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, ExternalPolicyLocal: rng.IntN(2) == 0,
				InternalPolicyLocal: rng.IntN(3) == 0, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i / 2)})}}
			if rng.IntN(2) == 0 {
				svc.HealthCheckNodePort = uint16(31000 + i/2)
			}
			var eps []model.Endpoint
			for j := range rng.IntN(4) {
				eps = append(eps, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), Port: 8080,
					NodeName: fmt.Sprintf("node-%d", 1+rng.IntN(2)), Ready: rng.IntN(3) > 0, Serving: true})
			}
			next.Services, next.Endpoints = next.Services.With(name, svc), next.Endpoints.With(name, eps)
		}
		st = &next
		out = append(out, st)
	}
	return out
}

// The health check node ports, the no-local-endpoints counts and the
// change tracker, kept from State to State, agree at every step with
// what a fresh one computes from that State alone.
func TestIncrementalMatchesFromScratch(t *testing.T) {
	for seed := range uint64(20) {
		var hc HealthChecks
		var nl noLocalIndex
		var tracker model.ChangeTracker
		var prev *model.State
		for i, st := range randomLineage(seed, 60) {
			got := hc.wanted(st)
			if want := wantedFromScratch(st); !maps.Equal(got, want) {
				t.Fatalf("seed %d, state %d: health checks %v, from scratch %v", seed, i, got, want)
			}
			nl.update(st, noLocalBuckets)
			if in, ex := noLocalFromScratch(st); nl.counts[0] != in || nl.counts[1] != ex {
				t.Fatalf("seed %d, state %d: no local endpoints %d/%d, from scratch %d/%d", seed, i, nl.counts[0], nl.counts[1], in, ex)
			}
			changed := tracker.Changes(st)
			if prev != nil {
				want := map[model.ServicePortName]bool{}
				for _, m := range []*model.State{prev, st} {
					for n := range m.Services.Keys() {
						if !samePort(prev, st, n) {
							want[n] = true
						}
					}
				}
				got := map[model.ServicePortName]bool{}
				for _, n := range changed {
					got[n] = true
				}
				if !maps.Equal(got, want) {
					t.Fatalf("seed %d, state %d: changes %v, want %v", seed, i, got, want)
				}
			}
			tracker.Record(st, changed)
			prev = st
		}
	}
}

// samePort reports whether a service port is the same in a and b.
func samePort(a, b *model.State, n model.ServicePortName) bool {
	x, okA := a.Services.Lookup(n)
	y, okB := b.Services.Lookup(n)
	if !okA || !okB {
		return okA == okB
	}
	return x.Equal(y) && model.EndpointsEqual(a.Endpoints.Get(n), b.Endpoints.Get(n))
}

// wantedFromScratch is HealthChecks.wanted computed from st alone, by
// the plain definition.
func wantedFromScratch(st *model.State) map[uint16]hcWant {
	type acc struct {
		port  uint16
		addrs map[netip.Addr]bool
	}
	bySvc := map[model.ServicePortName]*acc{}
	for name, svc := range st.Services.All() {
		if svc.HealthCheckNodePort == 0 || !svc.ExternalPolicyLocal {
			continue
		}
		n := serviceOf(name)
		if bySvc[n] == nil {
			bySvc[n] = &acc{addrs: map[netip.Addr]bool{}}
		}
		bySvc[n].port = max(bySvc[n].port, svc.HealthCheckNodePort)
		for _, ep := range st.Endpoints.Get(name) {
			if ep.Ready && ep.IsLocal(st.Node.Name) {
				bySvc[n].addrs[ep.Addr] = true
			}
		}
	}
	names := slices.SortedFunc(maps.Keys(bySvc), func(a, b model.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	want := map[uint16]hcWant{}
	for _, n := range names {
		a := bySvc[n]
		if _, taken := want[a.port]; taken {
			continue
		}
		v4 := 0
		for addr := range a.addrs {
			if addr.Is4() {
				v4++
			}
		}
		want[a.port] = hcWant{n, max(v4, len(a.addrs)-v4)}
	}
	return want
}

// noLocalFromScratch counts the Local-policy service ports of st with
// endpoints, none local, per policy.
func noLocalFromScratch(st *model.State) (internal, external int) {
	for name, svc := range st.Services.All() {
		_, local, _, hasAny := model.CategorizeEndpoints(svc, st.Endpoints.Get(name), st.Node)
		if !hasAny || len(local) > 0 {
			continue
		}
		if svc.InternalPolicyLocal {
			internal++
		}
		if svc.ExternalPolicyLocal {
			external++
		}
	}
	return internal, external
}
