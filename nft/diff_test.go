package nft

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// txScript is a transaction as an nft script, in the order it is sent
// (the order matters to the kernel), after a comment line saying what it is.
func txScript(what string, x *nftlib.Tx) string {
	var id uint32
	return "# " + what + "\n" + x.Script(&id)
}

func ipv4(st *proxier.State) *nftlib.Table { return Build(st, demoConfig()).Table(nftlib.IPv4) }

// The incremental transaction of each kind of change, in full, against
// testdata/tx/diff-<case>.nft (go test ./nft -run TestDiff -update
// rewrites them), and the chains it leaves stale for the next sync.
func TestDiff(t *testing.T) {
	web := proxier.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
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
			x, stale, _ := nftlib.DiffTx(tt.have, tt.want, nftlib.AllKeys(tt.have, tt.want), tt.pending, func(string) bool { return true })
			golden.Check(t, filepath.Join("tx", "diff-"+tt.name+".nft"), "the transaction", txScript(tt.what, x))
			slices.Sort(stale)
			if strings.Join(stale, ",") != strings.Join(tt.stale, ",") {
				t.Errorf("stale = %v, want %v", stale, tt.stale)
			}
		})
	}
}

// A full sync over an existing table flushes everything and rebuilds it in
// the same transaction (testdata/tx/full-over-existing.nft), and leaves
// unknown chains for deletion next time.
func TestFullTx(t *testing.T) {
	want := ipv4(demoState())
	x, stale := nftlib.FullTx(want, &nftlib.KernelTable{Exists: true, Udata: nftlib.CommentUdata(0, want.Comment),
		Chains: map[string]*nftlib.KernelChain{"KUBE-SERVICES": {}, "KUBE-SVC-OLD": {}},
		Sets: map[string]*nftlib.KernelSet{"service-ips": {Flags: unix.NFT_SET_MAP, KeyType: nftlib.ConcatType(nftlib.IPv4, want.Map("service-ips").Key),
			KeyLen: nftlib.KeyLen(nftlib.IPv4, want.Map("service-ips").Key), DataType: nftlib.VerdictType,
			Udata: nftlib.CommentUdata(nftlib.SetCommentType, want.Map("service-ips").Comment)}}}, false)
	what := "full sync of the demo state over a table holding chains KUBE-SERVICES and KUBE-SVC-OLD and map service-ips: " +
		"flushed and rebuilt in one transaction, only what is missing added"
	golden.Check(t, filepath.Join("tx", "full-over-existing.nft"), "the transaction", txScript(what, x))
	if len(stale) != 1 || stale[0] != "KUBE-SVC-OLD" {
		t.Errorf("stale = %v, want [KUBE-SVC-OLD]", stale)
	}
}
