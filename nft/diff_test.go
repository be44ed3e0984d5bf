package nft

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// txScript is a transaction as an nft script, in the order it is sent
// (the order matters to the kernel), after a comment line saying what it is.
func txScript(what string, x *nftlib.Tx) string {
	var id uint32
	return "# " + what + "\n" + x.Script(&id)
}

// ipv4 is the main ip table that st builds.
func ipv4(st *model.State) *nftlib.Table {
	for _, t := range Build(st, demoConfig()).Tables {
		if t.Family == nftlib.IPv4 && !t.Secondary {
			return t
		}
	}
	return nil
}

// The incremental transaction of each kind of change, in full, against
// testdata/tx/diff-<case>.nft (go test ./nft -run TestDiff -update
// rewrites them), and the chains it leaves stale for the next sync.
func TestDiff(t *testing.T) {
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	base := demoState()
	moved := demoState()
	moved.Endpoints.Get(web)[1].Addr = netip.MustParseAddr("10.244.0.12")
	gone := demoState()
	gone.Services = gone.Services.Without(web)
	gone.Endpoints = gone.Endpoints.Without(web)

	tests := []struct {
		name    string // also the golden file's
		what    string // the file's first line
		have    *nftlib.Table
		want    *nftlib.Table
		pending []string
		stale   []string
	}{
		{name: "unchanged", what: "the demo state again: nothing to send", have: ipv4(base), want: ipv4(base)},
		{
			name: "one-endpoint-moved", what: "web's second endpoint moves from 10.244.0.11 to 10.244.0.12: a new KUBE-SEP, KUBE-SVC rewritten, the old KUBE-SEP flushed",
			have: ipv4(base), want: ipv4(moved),
			stale: []string{"KUBE-SEP-QZSIC2ZS53EHPBVZ"},
		},
		{
			name: "stale-chains-deleted", what: "the next sync, nothing changed: the chain the last one left stale is deleted",
			have: ipv4(moved), want: ipv4(moved), pending: []string{"KUBE-SEP-QZSIC2ZS53EHPBVZ"},
		},
		{
			name: "service-removed", what: "web removed: its map elements deleted, its chains flushed (deleted a sync later)",
			have: ipv4(base), want: ipv4(gone),
			stale: []string{"KUBE-EXT-CDGGSHYLG3RE2FKL", "KUBE-SEP-3MRQQDVYO2GBIBDV", "KUBE-SEP-QZSIC2ZS53EHPBVZ", "KUBE-SVC-CDGGSHYLG3RE2FKL"},
		},
		{
			name: "service-added", what: "web added: chains, then their rules, then the map elements that reach them",
			have: ipv4(gone), want: ipv4(base),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := keysOfTables(tt.have, tt.want)
			x, stale := nftlib.DiffTx(tt.have, tt.want, keys)
			deleteDueChains(x, tt.have, tt.want, keys, tt.pending, func(string) bool { return true })
			golden.Check(t, filepath.Join("tx", "diff-"+tt.name+".nft"), "the transaction", txScript(tt.what, x))
			slices.Sort(stale)
			if strings.Join(stale, ",") != strings.Join(tt.stale, ",") {
				t.Errorf("stale = %v, want %v", stale, tt.stale)
			}
		})
	}
}

// keysOfTables lists the fragment keys of the tables, each once.
func keysOfTables(tables ...*nftlib.Table) []string {
	var keys []string
	for _, t := range tables {
		for key := range t.Fragments {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// kernelHolding is the kernel's view of a table that holds just have's
// objects, read back from a fake kernel that was given them.
func kernelHolding(t *testing.T, have *nftlib.Table) *nftlib.KernelTable {
	t.Helper()
	k := nftlib.NewFakeKernel()
	x, _ := nftlib.FullTx(have, &nftlib.KernelTable{}, false)
	if err := k.Commit(func(tx nftlib.KernelTx) {
		var setID uint32
		x.Write(tx, &setID)
	}); err != nil {
		t.Fatal(err)
	}
	kts, err := k.ReadFamily(have.Family, []string{have.Name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kts[have.Name]
}

// A full sync over an existing table flushes everything and rebuilds it in
// the same transaction (testdata/tx/full-over-existing.nft), and leaves
// unknown chains for deletion next time.
func TestFullTx(t *testing.T) {
	want := ipv4(demoState())
	services := *want.Map("service-ips")
	services.Elements = nil
	have := kernelHolding(t, &nftlib.Table{Family: nftlib.IPv4, Name: want.Name, Comment: want.Comment,
		Chains: []*nftlib.Chain{{Name: "KUBE-SERVICES"}, {Name: "KUBE-SVC-OLD"}}, Maps: []*nftlib.Map{&services}})
	x, stale := nftlib.FullTx(want, have, false)
	what := "full sync of the demo state over a table holding chains KUBE-SERVICES and KUBE-SVC-OLD and map service-ips: " +
		"flushed and rebuilt in one transaction, only what is missing added"
	golden.Check(t, filepath.Join("tx", "full-over-existing.nft"), "the transaction", txScript(what, x))
	if len(stale) != 1 || stale[0] != "KUBE-SVC-OLD" {
		t.Errorf("stale = %v, want [KUBE-SVC-OLD]", stale)
	}
}
