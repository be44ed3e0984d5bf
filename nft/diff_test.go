package nft

import (
	"net/netip"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// script runs one diff of a table and returns its commands, sorted within
// each kind so the comparison does not depend on map iteration order.
func script(have, want *nftlib.Table, pending []string) (string, []string) {
	x, stale, _ := nftlib.DiffTx(have, want, nftlib.AllKeys(have, want), pending, func(string) bool { return true })
	var w nftlib.ScriptWriter
	var id uint32
	x.Write(&w, &id)
	lines := strings.Split(strings.TrimSpace(w.B.String()), "\n")
	sort.Strings(lines)
	sort.Strings(stale)
	if len(lines) == 1 && lines[0] == "" {
		lines = nil
	}
	return strings.Join(lines, "\n"), stale
}

func ipv4(st *proxier.State) *nftlib.Table { return Build(st, demoConfig()).Table(nftlib.IPv4) }

func TestDiff(t *testing.T) {
	web := proxier.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	base := demoState()
	moved := demoState()
	moved.Endpoints[web][1].Addr = netip.MustParseAddr("10.244.0.12")
	gone := demoState()
	delete(gone.Services, web)
	delete(gone.Endpoints, web)

	tests := []struct {
		name      string
		have      *nftlib.Table
		want      *nftlib.Table
		pending   []string
		wantLines []string // commands that must appear
		notLines  []string // commands that must not
		stale     []string
	}{
		{name: "unchanged", have: ipv4(base), want: ipv4(base)},
		{
			name: "one endpoint moved",
			have: ipv4(base), want: ipv4(moved),
			wantLines: []string{
				"add chain ip kube-nftproxy KUBE-SEP-",
				"add rule ip kube-nftproxy KUBE-SVC-CDGGSHYLG3RE2FKL numgen random mod 2 0 goto",
				"flush chain ip kube-nftproxy KUBE-SVC-CDGGSHYLG3RE2FKL",
				"flush chain ip kube-nftproxy KUBE-SEP-QZSIC2ZS53EHPBVZ",
				"meta l4proto tcp dnat to 10.244.0.12:8080",
			},
			notLines: []string{"add chain ip kube-nftproxy KUBE-SEP-3MRQQDVYO2GBIBDV", "KUBE-SEP-3MRQQDVYO2GBIBDV ip saddr", "element", "dns-like", "delete chain"},
			stale:    []string{"KUBE-SEP-QZSIC2ZS53EHPBVZ"},
		},
		{
			name: "stale chains deleted one sync later",
			have: ipv4(moved), want: ipv4(moved), pending: []string{"KUBE-SEP-QZSIC2ZS53EHPBVZ"},
			wantLines: []string{"delete chain ip kube-nftproxy KUBE-SEP-QZSIC2ZS53EHPBVZ"},
		},
		{
			name: "service removed",
			have: ipv4(base), want: ipv4(gone),
			wantLines: []string{
				"delete element ip kube-nftproxy service-ips { 10.96.0.10 . tcp . 80 }",
				"delete element ip kube-nftproxy service-nodeports { tcp . 30080 }",
				"flush chain ip kube-nftproxy KUBE-SVC-CDGGSHYLG3RE2FKL",
				"flush chain ip kube-nftproxy KUBE-EXT-CDGGSHYLG3RE2FKL",
			},
			notLines: []string{"add ", "delete chain"},
			stale:    []string{"KUBE-EXT-CDGGSHYLG3RE2FKL", "KUBE-SEP-3MRQQDVYO2GBIBDV", "KUBE-SEP-QZSIC2ZS53EHPBVZ", "KUBE-SVC-CDGGSHYLG3RE2FKL"},
		},
		{
			name: "service added",
			have: ipv4(gone), want: ipv4(base),
			wantLines: []string{
				"add element ip kube-nftproxy service-ips { 10.96.0.10 . tcp . 80 comment \"default/web:http cluster IP\" : goto KUBE-SVC-CDGGSHYLG3RE2FKL }",
				"add chain ip kube-nftproxy KUBE-EXT-CDGGSHYLG3RE2FKL",
			},
			notLines: []string{"flush", "delete"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, stale := script(tt.have, tt.want, tt.pending)
			for _, l := range tt.wantLines {
				if !strings.Contains(got, l) {
					t.Errorf("missing %q in:\n%s", l, got)
				}
			}
			for _, l := range tt.notLines {
				if strings.Contains(got, l) {
					t.Errorf("unexpected %q in:\n%s", l, got)
				}
			}
			if len(tt.wantLines) == 0 && got != "" {
				t.Errorf("expected no commands, got:\n%s", got)
			}
			if strings.Join(stale, ",") != strings.Join(tt.stale, ",") {
				t.Errorf("stale = %v, want %v", stale, tt.stale)
			}
		})
	}
}

// A full sync over an existing table flushes everything and rebuilds it in
// the same transaction, and leaves unknown chains for deletion next time.
func TestFullTx(t *testing.T) {
	want := ipv4(demoState())
	x, stale := nftlib.FullTx(want, &nftlib.KernelTable{Exists: true, Udata: nftlib.CommentUdata(0, want.Comment),
		Chains: map[string]*nftlib.KernelChain{"KUBE-SERVICES": {}, "KUBE-SVC-OLD": {}},
		Sets: map[string]*nftlib.KernelSet{"service-ips": {Flags: unix.NFT_SET_MAP, KeyType: nftlib.ConcatType(nftlib.IPv4, want.Map("service-ips").Key),
			KeyLen: nftlib.KeyLen(nftlib.IPv4, want.Map("service-ips").Key), DataType: nftlib.VerdictType,
			Udata: nftlib.CommentUdata(nftlib.SetCommentType, want.Map("service-ips").Comment)}}}, false)
	var w nftlib.ScriptWriter
	var id uint32
	x.Write(&w, &id)
	got := w.B.String()
	for _, l := range []string{"flush table ip kube-nftproxy", "flush map ip kube-nftproxy service-ips", "add map ip kube-nftproxy service-nodeports"} {
		if !strings.Contains(got, l) {
			t.Errorf("missing %q in:\n%s", l, got)
		}
	}
	if strings.Contains(got, "add chain ip kube-nftproxy KUBE-SERVICES\n") {
		t.Errorf("re-added an existing chain:\n%s", got)
	}
	if len(stale) != 1 || stale[0] != "KUBE-SVC-OLD" {
		t.Errorf("stale = %v, want [KUBE-SVC-OLD]", stale)
	}
	// Order matters to the kernel: flush before rules are added.
	if strings.Index(got, "flush table") > strings.Index(got, "add rule") {
		t.Errorf("rules added before the flush:\n%s", got)
	}
}
