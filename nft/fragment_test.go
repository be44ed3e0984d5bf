package nft

import (
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// A service port's fragment is a function of the port, its endpoints, the
// configuration and the Node alone: the backend rebuilds the applied
// fragments from the recorded State (Backend.appliedPort) instead of
// keeping them, which holds only while no fragment reads another port or
// anything global. So for every golden case, family and service port, the
// fragment a whole-State build places (Build, and placeAll as a full sync
// places them) is the one a build of a State holding that port alone
// places, and BuildFragment's own.
func TestFragmentDependsOnItsPortAlone(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			whole := tablesOf(t, Build(tc.st, tc.cfg), tc.cfg)
			placed := map[tableID]*nftlib.Table{}
			for _, id := range tableIDs() {
				placed[id] = BuildTable(id.f, tc.cfg, tc.st.Node, id.kind)
			}
			placeAll(placed, tc.cfg, tc.st, tc.st.Node, homeKind)
			compared := 0
			for name, svc := range tc.st.Services.All() {
				alone := tablesOf(t, Build(portAlone(tc.st, name), tc.cfg), tc.cfg)
				key := fragmentKey(name)
				for _, f := range nftlib.Families {
					id := tableID{f, homeTable(svc)}
					// Each fragment is shown in the whole build's fixed
					// parts, so that only the fragments differ.
					show := func(fr *nftlib.Fragment) string { return fragmentText(whole[id], key, fr) }
					want := show(alone[id].Fragments[key])
					if alone[id].Fragments[key] != nil {
						compared++
					}
					eps := tc.st.Endpoints.Get(name)
					for _, got := range []struct{ how, text string }{
						{"Build of the whole State", show(whole[id].Fragments[key])},
						{"placeAll of the whole State", show(placed[id].Fragments[key])},
						{"BuildFragment", show(BuildFragment(f, tc.cfg, tc.st.Node, svc, eps))},
					} {
						if got.text != want {
							t.Errorf("%s in %s: %s places\n%s\nwhile a State holding it alone places\n%s", key, f, got.how, got.text, want)
						}
					}
				}
			}
			if compared == 0 {
				t.Error("no service port has a fragment: nothing was compared")
			}
		})
	}
}

// portAlone is a State holding st's service port name and its endpoints
// alone, with st's Node: no other port, no ServiceCIDRs, no changes.
func portAlone(st *model.State, name model.ServicePortName) *model.State {
	one := model.NewState()
	one.Node = st.Node
	svc, _ := st.Services.Lookup(name)
	one.Services = one.Services.With(name, svc)
	if eps := st.Endpoints.Get(name); eps != nil {
		one.Endpoints = one.Endpoints.With(name, eps)
	}
	return one
}

// tablesOf indexes a Ruleset's tables as the backend names them.
func tablesOf(t *testing.T, rs *nftlib.Ruleset, cfg Config) map[tableID]*nftlib.Table {
	t.Helper()
	suffix := map[TableKind]string{MainTable: "", DeltaTable: deltaSuffix, AffinityTable: affinitySuffix}
	out := map[tableID]*nftlib.Table{}
	for _, tb := range rs.Tables {
		for _, id := range tableIDs() {
			if id.f == tb.Family && tb.Name == cfg.TableName+suffix[id.kind] {
				out[id] = tb
			}
		}
	}
	if len(out) != len(tableIDs()) {
		t.Fatalf("the ruleset holds %d of our %d tables", len(out), len(tableIDs()))
	}
	return out
}

// fragmentText is the nft text of t's fixed parts with fr (nil: none) as
// its only fragment, under key.
func fragmentText(t *nftlib.Table, key string, fr *nftlib.Fragment) string {
	one := withoutFragments(t)
	if fr != nil {
		one.Fragments[key] = fr
	}
	return (&nftlib.Ruleset{Tables: []*nftlib.Table{one}}).String()
}
