package nftlib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

func strAttr(a *nlmsg.Attrs, typ uint16, s string) { a.Put(typ, append([]byte(s), 0)...) }

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
		t.Errorf("JumpTargets = %q, want %q", got, want)
	}
	if got := jumpTargets([]byte{1, 2, 3}); got != nil {
		t.Errorf("JumpTargets of garbage = %q, want none", got)
	}
}

// A refusal names the deletion the kernel refused: a rule by its handle, a
// chain flushed, a table flushed.
func TestBatchDescribeDeletions(t *testing.T) {
	b := newBatch(10)
	b.DelRule(IPv4, "nat", "PREROUTING", 7)
	b.FlushChain(IPv4, "nat", "KUBE-SERVICES")
	b.FlushChain(IPv6, "t", "")
	b.DelTable(IPv6, "kube-proxy")
	for i, want := range []string{"delete rule PREROUTING handle 7", "flush chain KUBE-SERVICES", "flush table t", "delete table kube-proxy"} {
		if got := b.describe(uint32(11 + i)); got != want {
			t.Errorf("Describe(%d) = %q, want %q", 11+i, got, want)
		}
	}
	if f, table := messageTable(b.message(11)); f != IPv4 || table != "nat" {
		t.Errorf("messageTable = %s %q, want ip nat", f, table)
	}
}

// TestKernelListForeign lists another program's table (written by nft):
// every table of every family, a table's chains with its base chains, its
// rules with their handles and jump targets, a chain looked up by name; and
// deletes a rule by its handle.
func TestKernelListForeign(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, `table ip nat {
	chain PREROUTING { type nat hook prerouting priority -100; jump KUBE-SERVICES; counter; }
	chain KUBE-SERVICES { goto KUBE-SVC-X; }
	chain KUBE-SVC-X { }
}
table bridge b { }
`)
	k := openTestKernel(t, ns)
	tables, err := k.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if want := []TableRef{{IPv4, "nat"}, {unix.NFPROTO_BRIDGE, "b"}}; !slices.Equal(tables, want) {
		t.Errorf("ListTables = %v, want %v", tables, want)
	}
	nat := TableRef{IPv4, "nat"}
	chains, err := k.ListChains(nat)
	if want := []ListedChain{{"PREROUTING", true}, {"KUBE-SERVICES", false}, {"KUBE-SVC-X", false}}; err != nil || !slices.Equal(chains, want) {
		t.Errorf("ListChains = %v, %v; want %v", chains, err, want)
	}
	for name, want := range map[string]bool{"KUBE-SVC-X": true, "KUBE-NODEPORTS": false} {
		if got, err := k.HasChain(nat, name); err != nil || got != want {
			t.Errorf("HasChain(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	rules, err := k.ListRules(nat)
	if err != nil || len(rules) != 3 {
		t.Fatalf("ListRules = %v, %v; want 3 rules", rules, err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, fmt.Sprint(r.Chain, r.Targets))
	}
	if want := []string{"PREROUTING[KUBE-SERVICES]", "PREROUTING[]", "KUBE-SERVICES[KUBE-SVC-X]"}; !slices.Equal(got, want) {
		t.Errorf("ListRules = %s, want %s", got, want)
	}
	b := k.startBatch()
	b.DelRule(IPv4, "nat", "PREROUTING", rules[0].Handle)
	if err := k.commit(b); err != nil {
		t.Fatal(err)
	}
	k.finished(b)
	if after, err := k.ListRules(nat); err != nil || len(after) != 2 || after[0].Handle != rules[1].Handle {
		t.Errorf("after deleting handle %d: %v, %v", rules[0].Handle, after, err)
	}
}

// TestKernelCommitRefusedMany has the kernel refuse every message of a
// large transaction: its errors overflow the receive buffer (the default
// one, and a small one). The refusal must be reported (as refused, or with
// its answers lost), without waiting forever, and the socket stay usable.
func TestKernelCommitRefusedMany(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, "table ip t { }\n")
	for _, tc := range []struct {
		name   string
		rcvBuf int // 0: OpenKernel's
	}{{"default buffer", 0}, {"small buffer", 4096}} {
		t.Run(tc.name, func(t *testing.T) {
			k := openTestKernel(t, ns)
			if tc.rcvBuf > 0 {
				if err := k.setReceiveBuffer(tc.rcvBuf); err != nil {
					t.Fatal(err)
				}
			}
			b := k.startBatch()
			for i := range 20000 {
				b.DelChain(IPv4, "t", fmt.Sprintf("missing-%d", i))
			}
			err := k.commit(b)
			k.finished(b)
			var refused *TxError
			switch {
			case errors.As(err, &refused):
				if refused.Errno != unix.ENOENT || refused.Op != "delete chain missing-0" || refused.Table != "t" {
					t.Errorf("refused: %v in %s %s, want ENOENT at the first deletion", refused, refused.Family, refused.Table)
				}
			case errors.Is(err, ErrAnswersLost):
			default:
				t.Errorf("Apply: %v, want a refusal", err)
			}
			t.Logf("Apply: %v", err)
			if tables, err := k.ListTables(); err != nil || len(tables) != 1 {
				t.Errorf("tables after the refusal: %v, %v", tables, err)
			}
		})
	}
}

// TestKernelAnswersLost loses a transaction's answers (a full receive
// queue): Apply says so, the transaction is applied all the same, and the
// socket's next transaction is not confused by the stale answers.
func TestKernelAnswersLost(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	k := openTestKernel(t, ns)
	if err := k.setReceiveBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if err := k.queueUnread(64); err != nil {
		t.Fatal(err)
	}
	b := k.startBatch()
	b.AddTable(IPv4, "lost", "")
	err := k.commit(b)
	k.finished(b)
	if !errors.Is(err, ErrAnswersLost) || !errors.Is(err, unix.ENOBUFS) {
		t.Errorf("Apply with a full queue: %v, want its answers lost", err)
	}
	// Stale answers left queued would keep the queue full: the next
	// transaction's ack would be dropped too, and Apply wait for ever.
	b = k.startBatch()
	b.DelTable(IPv4, "lost")
	done := make(chan error, 1)
	go func() { done <- k.commit(b) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the next transaction: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next transaction's result never came (its ack dropped behind stale answers)")
	}
	k.finished(b)
	if tables, err := k.ListTables(); err != nil || len(tables) != 0 {
		t.Errorf("tables: %v, %v; want none", tables, err)
	}
}

// A full sync over a table holding another process's objects deletes its
// named sets, objects and flowtables after the flush that drops the rules
// using them, and leaves anonymous sets and chains to go with their rules;
// with replace, it deletes and adds the table instead, in the same
// transaction (testdata/tx/full-*-foreign.nft; -update rewrites them).
func TestFullTxForeign(t *testing.T) {
	want := stageTable(1)
	have := func() *KernelTable {
		return &KernelTable{Exists: true, udata: commentUdata(0, want.Comment),
			Chains: map[string]*kernelChain{"KUBE-SERVICES": {}, "__chain0": {Flags: NftChainBinding}, "offload": {Base: true}},
			Sets: map[string]*kernelSet{"__set0": {Flags: unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT},
				"__map0": {Flags: unix.NFT_SET_ANONYMOUS | unix.NFT_SET_MAP}, "foreign": {}},
			objs:       []kernelObject{{Type: 1, Name: "fc"}, {Type: 2, Name: "fq"}, {Type: 3, Name: "fh"}, {Type: 99, Name: "odd"}},
			flowtables: []string{"ff"}}
	}
	for _, tt := range []struct {
		replace bool
		file    string
		what    string
	}{
		{false, "full-over-foreign.nft", "full sync over a table holding foreign chains, sets, objects and a flowtable: " +
			"flushed, the foreign named objects deleted after the flush, anonymous ones (__set0, __map0, __chain0) left to go with their rules"},
		{true, "full-replace-foreign.nft", "the same with replace: the table deleted and added in the same transaction, nothing else deleted"},
	} {
		x, _ := FullTx(want, have(), tt.replace)
		golden.Check(t, filepath.Join("tx", tt.file), "the transaction", "# "+tt.what+"\n"+script(x))
	}
}
