package conntrack

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// The cleaner's Targets, updated from State to State by the changed
// service ports, are at every step those NewTargets builds from the
// State alone; a TCP-only change costs no copy (the same Targets).
func TestTargetsUpdateMatchesNewTargets(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 11))
		lin := &model.Lineage{}
		st := &model.State{Changes: model.StateChanges{Lineage: lin, Gen: 1, NodeChanged: true}}
		c := &Cleaner{}
		for step := range 80 {
			cur := c.targets(st)
			if got, want := targetsView(cur), targetsView(NewTargets(st)); !maps.Equal(got, want) {
				t.Fatalf("seed %d, step %d: targets %v, want %v", seed, step, got, want)
			}
			c.prev, c.prevState = cur, st
			next := *st
			next.Changes = model.StateChanges{Lineage: lin, Gen: st.Changes.Gen + 1 + uint64(step%5/4)}
			tcpOnly := true
			for range 1 + rng.IntN(3) {
				i := rng.IntN(30)
				name := model.ServicePortName{Namespace: "ns", Name: fmt.Sprint("svc-", i)}
				next.Changes.Ports = append(next.Changes.Ports, name)
				if old := st.Services.Get(name); old != nil && old.Protocol != model.TCP {
					tcpOnly = false
				}
				if rng.IntN(4) == 0 {
					next.Services, next.Endpoints = next.Services.Without(name), next.Endpoints.Without(name)
					continue
				}
				proto := []model.Protocol{model.TCP, model.UDP, model.SCTP}[rng.IntN(3)]
				tcpOnly = tcpOnly && proto == model.TCP
				svc := &model.ServicePort{Name: name, Protocol: proto, Port: uint16(50 + rng.IntN(3)),
					ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})}} // no two Services share a key
				if rng.IntN(2) == 0 {
					svc.NodePort = uint16(30000 + i)
				}
				var eps []model.Endpoint
				for j := range rng.IntN(3) {
					eps = append(eps, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), Port: 53, Ready: rng.IntN(2) == 0, Serving: true})
				}
				next.Services, next.Endpoints = next.Services.With(name, svc), next.Endpoints.With(name, eps)
			}
			if tcpOnly && c.targets(&next) != cur {
				t.Fatalf("seed %d, step %d: a TCP-only change copied the targets", seed, step)
			}
			st = &next
		}
	}
}

// targetsView is t as comparable values: per key, the endpoints.
func targetsView(t *Targets) map[targetKey]string {
	out := map[targetKey]string{}
	for k, tg := range t.byKey {
		eps := make([]string, 0, len(tg.endpoints))
		for ep := range tg.endpoints {
			eps = append(eps, ep.String())
		}
		slices.Sort(eps)
		out[k] = fmt.Sprint(eps)
	}
	return out
}
