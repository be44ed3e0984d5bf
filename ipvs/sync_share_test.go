package ipvs

import (
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// deepVirtual copies a plan's virtual servers, real servers included.
func deepVirtual(p *Plan) map[model.ServicePortName][]ipvsnl.VirtualServer {
	out := map[model.ServicePortName][]ipvsnl.VirtualServer{}
	for name, fr := range p.Services {
		for _, v := range fr.Virtual {
			out[name] = append(out[name], ipvsnl.VirtualServer{Service: v.Service, Dests: slices.Clone(v.Dests)})
		}
	}
	return out
}

// The Syncer keeps a converged virtual server's applied real servers as the
// plan's own slice (one copy of each real server, not two). Every later
// change to them, a real server draining (weight 0), one back from
// draining, one added, one deleted, must copy first: the plans it was
// given stay as they were built.
func TestSyncLeavesPlansUnchanged(t *testing.T) {
	r := newRig(t)
	st := demoState()
	first := BuildPlan(st, Config{}, nodeAddrs)
	want := deepVirtual(first)
	if _, err := r.s.Sync(first); err != nil {
		t.Fatal(err)
	}
	eps := st.Endpoints.Get(dnsTCP)
	steps := []struct {
		name string
		eps  []model.Endpoint
	}{
		{"an endpoint drains", eps[:1]},
		{"it comes back", eps},
		{"one more", append(slices.Clone(eps), ready("10.244.3.3", 53, "c"))},
		{"UDP endpoint removed", nil},
	}
	plans := []*Plan{first}
	wants := []map[model.ServicePortName][]ipvsnl.VirtualServer{want}
	for _, step := range steps {
		next := clone(st)
		if step.eps != nil {
			next.Endpoints = next.Endpoints.With(dnsTCP, step.eps)
		} else {
			next.Endpoints = next.Endpoints.With(dnsUDP, st.Endpoints.Get(dnsUDP)[:1])
		}
		p := BuildPlan(next, Config{}, nodeAddrs)
		plans, wants = append(plans, p), append(wants, deepVirtual(p))
		if _, err := r.s.Sync(p); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		r.kernelMatches(next, dnsVIP.String()+" "+eps[len(eps)-1].Addr.String()+":53")
		for i, p := range plans {
			for name, vs := range deepVirtual(p) {
				for j, v := range vs {
					if !slices.Equal(v.Dests, wants[i][name][j].Dests) {
						t.Errorf("after %q: plan %d's %s real servers became %v, were %v", step.name, i, v.ServiceKey, v.Dests, wants[i][name][j].Dests)
					}
				}
			}
		}
	}
}
