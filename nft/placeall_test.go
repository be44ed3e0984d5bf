package nft

import (
	"runtime"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// A full sync's fragments built on several CPUs (three here: three CPUs, and
// more than three times buildParallelMin service ports) are those built one
// by one.
func TestPlaceAllMatchesPlace(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	st := scaleState(3*buildParallelMin+5, 2)
	withAffinity(st, func(n model.ServicePortName) bool { return len(n.Name)%3 == 0 })
	b, err := NewBackend(nil, BackendConfig{Rules: demoConfig()})
	if err != nil {
		t.Fatal(err)
	}
	render := func(parallel bool) string {
		want := map[tableID]*nftlib.Table{}
		for _, id := range tableIDs() {
			want[id] = BuildTable(id.f, b.cfg, st.Node, id.kind)
		}
		if parallel {
			placeAll(want, b.cfg, st, st.Node, homeKind)
		} else {
			for name, svc := range st.Services.All() {
				b.place(want, name, homeTable(svc), st.Node, svc, st.Endpoints.Get(name))
			}
		}
		rs := &nftlib.Ruleset{}
		for _, id := range tableIDs() {
			rs.Tables = append(rs.Tables, want[id])
		}
		return rs.String()
	}
	if serial, par := render(false), render(true); serial != par {
		t.Errorf("the tables differ: %d bytes built in parallel, %d one by one", len(par), len(serial))
	}
}
