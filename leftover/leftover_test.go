package leftover

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

func TestIsKubeProxyChain(t *testing.T) {
	for _, tc := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-SEP-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-XLB-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-SVC-", false},
		{"nat", "KUBE-LOAD-BALANCER", true},
		{"filter", "KUBE-SVC-ABCDEFGHIJKLMNOP", false}, // only nat has per-Service chains
		{"filter", "KUBE-IPVS-OUT-FILTER", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		// kubelet's
		{"filter", "KUBE-FIREWALL", false},
		{"mangle", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		{"nat", "KUBE-MARK-DROP", false},
		// someone else's
		{"nat", "DOCKER", false},
		{"nat", "kube-services", false},
		{"raw", "KUBE-SERVICES", false},
	} {
		if got := isKubeProxyChain(tc.table, tc.chain); got != tc.want {
			t.Errorf("isKubeProxyChain(%q, %q) = %v, want %v", tc.table, tc.chain, got, tc.want)
		}
	}
}

func TestPlanIPTables(t *testing.T) {
	nat := nftlib.TableRef{Family: nftlib.IPv4, Name: "nat"}
	chains := []nftlib.ListedChain{
		{Name: "PREROUTING", Base: true}, {Name: "POSTROUTING", Base: true}, {Name: "DOCKER", Base: false},
		{Name: "KUBE-SERVICES", Base: false}, {Name: "KUBE-SVC-X1", Base: false}, {Name: "KUBE-POSTROUTING", Base: false},
		// A base chain is never deleted, whatever its name.
		{Name: "KUBE-MARK-MASQ", Base: true},
	}
	rules := []nftlib.ListedRule{
		{Chain: "PREROUTING", Handle: 1, Targets: []string{"DOCKER"}},
		{Chain: "PREROUTING", Handle: 2, Targets: []string{"KUBE-SERVICES"}},
		{Chain: "POSTROUTING", Handle: 3, Targets: nil},
		{Chain: "POSTROUTING", Handle: 4, Targets: []string{"KUBE-POSTROUTING"}},
		{Chain: "DOCKER", Handle: 5, Targets: []string{"KUBE-SVC-X1"}}, // odd, but it would keep the chain alive
		{Chain: "KUBE-SERVICES", Handle: 6, Targets: []string{"KUBE-SVC-X1"}},
		{Chain: "KUBE-SVC-X1", Handle: 7, Targets: []string{"KUBE-MARK-MASQ"}},
	}
	p := planIPTables(nat, chains, rules)
	if want := []string{"KUBE-POSTROUTING", "KUBE-SERVICES", "KUBE-SVC-X1"}; !slices.Equal(p.chains, want) {
		t.Errorf("chains %q, want %q", p.chains, want)
	}
	var handles []uint64
	for _, r := range p.jumps {
		handles = append(handles, r.Handle)
	}
	if want := []uint64{2, 4, 5}; !slices.Equal(handles, want) {
		t.Errorf("jump rules %v, want handles %v", handles, want)
	}
	f := nftFound{tables: []nftlib.TableRef{{Family: nftlib.IPv6, Name: NFTablesTable}}, iptables: []iptChains{p}}
	want := []string{"table ip6 kube-proxy", "ip nat: 3 chains (KUBE-POSTROUTING, KUBE-SERVICES, KUBE-SVC-X1), 3 jumps from PREROUTING, POSTROUTING, DOCKER"}
	if got := f.describe(); !slices.Equal(got, want) {
		t.Errorf("describe() = %q, want %q", got, want)
	}
}

// TestRemovalTransaction checks the whole removal transaction, as nft
// commands: kube-proxy's tables, then the jumps to its chains, then its
// chains flushed, then deleted.
func TestRemovalTransaction(t *testing.T) {
	nat := nftlib.TableRef{Family: nftlib.IPv4, Name: "nat"}
	filter6 := nftlib.TableRef{Family: nftlib.IPv6, Name: "filter"}
	f := &nftFound{
		tables: []nftlib.TableRef{{Family: nftlib.IPv4, Name: NFTablesTable}, {Family: nftlib.IPv6, Name: NFTablesTable}},
		iptables: []iptChains{
			{table: nat, chains: []string{"KUBE-SERVICES", "KUBE-SVC-X1"}, jumps: []nftlib.ListedRule{
				{Chain: "PREROUTING", Handle: 2, Targets: []string{"KUBE-SERVICES"}},
				{Chain: "OUTPUT", Handle: 9, Targets: []string{"KUBE-SERVICES"}},
			}},
			{table: filter6, chains: []string{"KUBE-FORWARD"}, jumps: []nftlib.ListedRule{
				{Chain: "FORWARD", Handle: 4, Targets: []string{"KUBE-FORWARD"}},
			}},
		},
	}
	var w scriptDeleter
	writeRemoval(&w, f)
	want := `delete table ip kube-proxy
delete table ip6 kube-proxy
delete rule ip nat PREROUTING handle 2
delete rule ip nat OUTPUT handle 9
delete rule ip6 filter FORWARD handle 4
flush chain ip nat KUBE-SERVICES
flush chain ip nat KUBE-SVC-X1
flush chain ip6 filter KUBE-FORWARD
delete chain ip nat KUBE-SERVICES
delete chain ip nat KUBE-SVC-X1
delete chain ip6 filter KUBE-FORWARD
`
	if got := w.String(); got != want {
		t.Errorf("removal transaction:\n%s\nwant\n%s", got, want)
	}
}

// scriptDeleter writes deletions as the nft commands that do them.
type scriptDeleter struct{ strings.Builder }

func (d *scriptDeleter) DelTable(f nftlib.Family, name string) {
	fmt.Fprintf(d, "delete table %s %s\n", f, name)
}

func (d *scriptDeleter) DelRule(f nftlib.Family, table, chain string, handle uint64) {
	fmt.Fprintf(d, "delete rule %s %s %s handle %d\n", f, table, chain, handle)
}

func (d *scriptDeleter) FlushChain(f nftlib.Family, table, chain string) {
	fmt.Fprintf(d, "flush chain %s %s %s\n", f, table, chain)
}

func (d *scriptDeleter) DelChain(f nftlib.Family, table, name string) {
	fmt.Fprintf(d, "delete chain %s %s %s\n", f, table, name)
}

// legacyEntry builds one ipt_entry (IPv4 layout) with a target named
// target and data.
func legacyEntry(target string, data []byte) []byte {
	const targetOffset = 112 // sizeof(struct ipt_entry), no matches
	tgt := make([]byte, targetHeader+len(data))
	binary.NativeEndian.PutUint16(tgt, uint16(len(tgt)))
	copy(tgt[2:], target)
	copy(tgt[targetHeader:], data)
	e := make([]byte, targetOffset, targetOffset+len(tgt))
	e = append(e, tgt...)
	binary.NativeEndian.PutUint16(e[88:], targetOffset)
	binary.NativeEndian.PutUint16(e[90:], uint16(len(e)))
	return e
}

func name32(s string) []byte { b := make([]byte, 32); copy(b, s); return b }

func TestLegacyChains(t *testing.T) {
	var blob []byte
	blob = append(blob, legacyEntry("", make([]byte, 8))...) // a built-in chain's policy (standard target)
	blob = append(blob, legacyEntry("ERROR", name32("KUBE-SERVICES"))...)
	blob = append(blob, legacyEntry("DNAT", make([]byte, 16))...)
	blob = append(blob, legacyEntry("ERROR", name32("DOCKER"))...)
	blob = append(blob, legacyEntry("ERROR", name32("ERROR"))...) // the table's end
	if got, want := legacyChains(blob, 88), []string{"KUBE-SERVICES", "DOCKER"}; !slices.Equal(got, want) {
		t.Errorf("legacyChains = %q, want %q", got, want)
	}
	// A truncated or corrupt blob stops the walk, never panics.
	for i := range blob {
		legacyChains(blob[:i], 88)
	}
	bad := append([]byte(nil), blob...)
	binary.NativeEndian.PutUint16(bad[90:], 0)
	if got := legacyChains(bad, 88); len(got) != 0 {
		t.Errorf("legacyChains of a zero-length entry = %q", got)
	}
}

func TestIPSetNames(t *testing.T) {
	names := ipsetNames()
	for _, want := range []string{"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP", "KUBE-6-LOAD-BALANCER-SOURCE-CID", "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"} {
		if !slices.Contains(names, want) {
			t.Errorf("ipsetNames lacks %q", want)
		}
	}
	for _, n := range names {
		if len(n) > ipsetMaxName || !strings.HasPrefix(n, "KUBE-") {
			t.Errorf("ipset name %q: longer than %d or not kube-proxy's", n, ipsetMaxName)
		}
	}
}

func TestDestroyMessage(t *testing.T) {
	m := destroyMessage("KUBE-CLUSTER-IP", 7)
	if l := binary.NativeEndian.Uint32(m); int(l) != len(m) {
		t.Fatalf("length %d, message %d bytes", l, len(m))
	}
	if typ := binary.NativeEndian.Uint16(m[4:]); typ != unix.NFNL_SUBSYS_IPSET<<8|ipsetCmdDestroy {
		t.Errorf("type %#x", typ)
	}
	// Without NLM_F_EXCL the kernel says nothing about a missing set.
	if flags := binary.NativeEndian.Uint16(m[6:]); flags&unix.NLM_F_EXCL == 0 || flags&unix.NLM_F_ACK == 0 {
		t.Errorf("flags %#x lack EXCL or ACK", flags)
	}
	var proto byte
	var name string
	nlmsg.Walk(m[nlmsg.HdrLen+nfgenLen:], func(typ uint16, d []byte) {
		switch typ {
		case ipsetAttrProtocol:
			proto = d[0]
		case ipsetAttrSetName:
			name = cstr(d)
		}
	})
	// A destroy without a name destroys every set: the name must be there.
	if proto != ipsetProtocolMin || name != "KUBE-CLUSTER-IP" {
		t.Errorf("protocol %d, name %q", proto, name)
	}
}
