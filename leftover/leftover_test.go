package leftover

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
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
	nat := table{familyIPv4, "nat"}
	chains := []chain{
		{"PREROUTING", true}, {"POSTROUTING", true}, {"DOCKER", false},
		{"KUBE-SERVICES", false}, {"KUBE-SVC-X1", false}, {"KUBE-POSTROUTING", false},
		// A base chain is never deleted, whatever its name.
		{"KUBE-MARK-MASQ", true},
	}
	rules := []rule{
		{"PREROUTING", 1, []string{"DOCKER"}},
		{"PREROUTING", 2, []string{"KUBE-SERVICES"}},
		{"POSTROUTING", 3, nil},
		{"POSTROUTING", 4, []string{"KUBE-POSTROUTING"}},
		{"DOCKER", 5, []string{"KUBE-SVC-X1"}}, // odd, but it would keep the chain alive
		{"KUBE-SERVICES", 6, []string{"KUBE-SVC-X1"}},
		{"KUBE-SVC-X1", 7, []string{"KUBE-MARK-MASQ"}},
	}
	p := planIPTables(nat, chains, rules)
	if want := []string{"KUBE-POSTROUTING", "KUBE-SERVICES", "KUBE-SVC-X1"}; !slices.Equal(p.chains, want) {
		t.Errorf("chains %q, want %q", p.chains, want)
	}
	var handles []uint64
	for _, r := range p.jumps {
		handles = append(handles, r.handle)
	}
	if want := []uint64{2, 4, 5}; !slices.Equal(handles, want) {
		t.Errorf("jump rules %v, want handles %v", handles, want)
	}
	f := nftFound{tables: []table{{familyIPv6, NFTablesTable}}, iptables: []iptChains{p}}
	want := []string{"table ip6 kube-proxy", "ip nat: 3 chains (KUBE-POSTROUTING, KUBE-SERVICES, KUBE-SVC-X1), 3 jumps from PREROUTING, POSTROUTING, DOCKER"}
	if got := f.describe(); !slices.Equal(got, want) {
		t.Errorf("describe() = %q, want %q", got, want)
	}
}

// verdictExpr encodes an immediate verdict expression as the kernel dumps it.
func verdictExpr(code int32, target string) []byte {
	var a nlmsg.Attrs
	a.Nest(unix.NFTA_LIST_ELEM, func(a *nlmsg.Attrs) {
		strAttr(a, unix.NFTA_EXPR_NAME, "immediate")
		a.Nest(unix.NFTA_EXPR_DATA, func(a *nlmsg.Attrs) {
			a.Put(unix.NFTA_IMMEDIATE_DREG, binary.BigEndian.AppendUint32(nil, 0)...)
			a.Nest(unix.NFTA_IMMEDIATE_DATA, func(a *nlmsg.Attrs) {
				a.Nest(unix.NFTA_DATA_VERDICT, func(a *nlmsg.Attrs) {
					a.Put(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(code))...)
					if target != "" {
						strAttr(a, unix.NFTA_VERDICT_CHAIN, target)
					}
				})
			})
		})
	})
	return a
}

func TestJumpTargets(t *testing.T) {
	var match nlmsg.Attrs // an xtables match, as iptables-nft writes
	match.Nest(unix.NFTA_LIST_ELEM, func(a *nlmsg.Attrs) {
		strAttr(a, unix.NFTA_EXPR_NAME, "match")
		a.Nest(unix.NFTA_EXPR_DATA, func(a *nlmsg.Attrs) {
			strAttr(a, 1, "comment")
			a.Put(3, make([]byte, 256)...)
		})
	})
	exprs := append(append([]byte(nil), match...), verdictExpr(unix.NFT_JUMP, "KUBE-SERVICES")...)
	exprs = append(exprs, verdictExpr(unix.NFT_GOTO, "KUBE-SVC-X")...)
	exprs = append(exprs, verdictExpr(1, "")...) // NF_ACCEPT
	if got, want := jumpTargets(exprs), []string{"KUBE-SERVICES", "KUBE-SVC-X"}; !slices.Equal(got, want) {
		t.Errorf("jumpTargets = %q, want %q", got, want)
	}
	if got := jumpTargets([]byte{1, 2, 3}); got != nil {
		t.Errorf("jumpTargets of garbage = %q, want none", got)
	}
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
