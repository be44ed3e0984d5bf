package nftlib

import (
	"encoding/binary"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// fakeProbeKernel answers probe transactions as an older or smaller kernel
// would: it refuses rules with an expression it lacks and sets with flags
// it does not know, and echoes tables and chains without the attributes it
// ignores.
type fakeProbeKernel struct {
	t            *testing.T
	noExpr       string // an expression the kernel has no module for
	noConcatSets bool   // no NFT_SET_CONCAT (before 5.6)
	noFamily     Family // a family without nf_tables (ipv6.disable=1)
	ignoreAttrs  map[uint16]uint16
	errno        syscall.Errno // refuse every transaction with this
	txs          int
}

// batchMessages splits a finished batch into its netlink messages.
func batchMessages(t *testing.T, b *batch) []syscall.NetlinkMessage {
	t.Helper()
	chunks, _, err := b.finish()
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, c := range chunks {
		all = append(all, c...)
	}
	b.release()
	msgs, err := syscall.ParseNetlinkMessage(all)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func (k *fakeProbeKernel) probeApply(b *batch) ([]syscall.NetlinkMessage, error) {
	k.txs++
	msgs := batchMessages(k.t, b)
	k.checkScratch(msgs)
	var echo []syscall.NetlinkMessage
	for _, m := range msgs {
		typ := m.Header.Type &^ (unix.NFNL_SUBSYS_NFTABLES << 8)
		raw := make([]byte, nlmsgHdrLen, nlmsgHdrLen+len(m.Data))
		binary.NativeEndian.PutUint16(raw[4:], m.Header.Type)
		raw = append(raw, m.Data...)
		refuse := k.errno
		switch {
		case k.noFamily != 0 && m.Data[0] == byte(k.noFamily):
			refuse = unix.EAFNOSUPPORT
		case typ == unix.NFT_MSG_NEWRULE && k.noExpr != "" && ruleHasExpr(m.Data[NfgenLen:], k.noExpr):
			refuse = unix.ENOENT
		case typ == unix.NFT_MSG_NEWSET && k.noConcatSets && setFlags(m.Data[NfgenLen:])&nftSetConcat != 0:
			refuse = unix.EOPNOTSUPP
		}
		if refuse != 0 {
			return nil, &TxError{Op: describeMessage(raw), Errno: refuse}
		}
		if m.Header.Flags&unix.NLM_F_ECHO != 0 {
			echo = append(echo, syscall.NetlinkMessage{Header: m.Header, Data: k.without(typ, m.Data)})
		}
	}
	return echo, nil
}

// checkScratch checks what makes a probe leave nothing behind: the batch
// creates a table that must not exist yet and ends by deleting it.
func (k *fakeProbeKernel) checkScratch(msgs []syscall.NetlinkMessage) {
	k.t.Helper()
	first, last := msgs[1], msgs[len(msgs)-2] // inside the batch markers
	nameOf := func(m syscall.NetlinkMessage) string {
		v, _ := findAttr(m.Data[NfgenLen:], unix.NFTA_TABLE_NAME)
		return strings.TrimRight(string(v), "\x00")
	}
	if first.Header.Type&0xff != unix.NFT_MSG_NEWTABLE || first.Header.Flags&unix.NLM_F_EXCL == 0 {
		k.t.Errorf("probe transaction starts with message type %d flags %#x, want a new table with NLM_F_EXCL",
			first.Header.Type, first.Header.Flags)
	}
	if last.Header.Type&0xff != unix.NFT_MSG_DELTABLE || nameOf(last) != nameOf(first) ||
		!strings.HasPrefix(nameOf(first), "knp-probe-test") {
		k.t.Errorf("probe transaction does not end by deleting its table %q (last: type %d table %q)",
			nameOf(first), last.Header.Type, nameOf(last))
	}
}

// without drops the attributes this kernel ignores from an echoed object.
func (k *fakeProbeKernel) without(typ uint16, data []byte) []byte {
	out := append([]byte(nil), data[:NfgenLen]...)
	forAttrs(data[NfgenLen:], func(a nlAttr) {
		if drop, ok := k.ignoreAttrs[typ]; ok && drop == a.typ {
			return
		}
		b := &batch{}
		b.attr(a.typ, a.data)
		out = append(out, b.Buf...)
	})
	return out
}

func ruleHasExpr(attrs []byte, name string) bool {
	found := false
	forAttrs(attrs, func(a nlAttr) {
		if a.typ != unix.NFTA_RULE_EXPRESSIONS {
			return
		}
		forAttrs(a.data, func(e nlAttr) {
			forAttrs(e.data, func(x nlAttr) {
				if x.typ == unix.NFTA_EXPR_NAME && x.str() == name {
					found = true
				}
			})
		})
	})
	return found
}

func setFlags(attrs []byte) uint32 {
	v, ok := findAttr(attrs, unix.NFTA_SET_FLAGS)
	if !ok || len(v) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}

func TestProbeNamesTheMissingFeature(t *testing.T) {
	for _, tc := range []struct {
		name      string
		kernel    fakeProbeKernel
		intervals bool     // interval sets of concatenations asked for
		want      []string // in the error; none: no error
	}{
		{name: "everything (5.10 and later)", intervals: true},
		{name: "4.19-5.9: table and chain comments ignored", intervals: true,
			kernel: fakeProbeKernel{ignoreAttrs: map[uint16]uint16{
				unix.NFT_MSG_NEWTABLE: nftaTableUserdata, unix.NFT_MSG_NEWCHAIN: nftaChainUserdata}},
			want: []string{"lacks table comments (NFTA_TABLE_USERDATA, Linux 5.10+) in family ip: it creates the object but drops the attribute"}},
		{name: "chain comments ignored",
			kernel: fakeProbeKernel{ignoreAttrs: map[uint16]uint16{unix.NFT_MSG_NEWCHAIN: nftaChainUserdata}},
			want:   []string{"lacks chain comments (NFTA_CHAIN_USERDATA, Linux 5.10+)"}},
		{name: "no fib module", kernel: fakeProbeKernel{noExpr: "fib"},
			want: []string{"lacks fib: fib daddr type local (expression fib, modules nft_fib_ipv4 and nft_fib_ipv6, Linux 4.10+) in family ip: " +
				"nftables transaction refused at \"add rule to probe\": no such file or directory"}},
		{name: "no numgen module", kernel: fakeProbeKernel{noExpr: "numgen"},
			want: []string{"lacks random numbers: numgen random", "module nft_numgen"}},
		{name: "no dynset", kernel: fakeProbeKernel{noExpr: "dynset"},
			want: []string{"lacks sticky sets"}},
		{name: "no masq module", kernel: fakeProbeKernel{noExpr: "masq"},
			want: []string{"lacks masquerade fully-random"}},
		{name: "interval sets asked for, before 5.6", intervals: true, kernel: fakeProbeKernel{noConcatSets: true},
			want: []string{"lacks interval sets of concatenations (NFT_SET_CONCAT, nft_set_pipapo, Linux 5.6+)",
				"operation not supported"}},
		{name: "interval sets not asked for", kernel: fakeProbeKernel{noConcatSets: true}},
		{name: "IPv6 disabled", kernel: fakeProbeKernel{noFamily: IPv6},
			want: []string{"lacks tables of this family (CONFIG_NF_TABLES_IPV4, CONFIG_NF_TABLES_IPV6, Linux 3.13+) in family ip6: " +
				"nftables transaction refused at \"add table knp-probe-test\": address family not supported by protocol"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.kernel
			k.t = t
			err := probeFeatures(&k, tc.intervals, "knp-probe-test", 1)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("probe: %v", err)
				}
				return
			}
			var missing *MissingFeatureError
			if !errors.As(err, &missing) {
				t.Fatalf("probe error = %v, want a MissingFeatureError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\n does not say %q", err, w)
				}
			}
		})
	}
}

// A refusal that is not about a feature (no CAP_NET_ADMIN) is not
// reported as a missing feature.
func TestProbePermissionIsNotAFeature(t *testing.T) {
	k := &fakeProbeKernel{t: t, errno: unix.EPERM}
	err := probeFeatures(k, false, "knp-probe-test", 1)
	var missing *MissingFeatureError
	if err == nil || errors.As(err, &missing) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("probe error = %v, want EPERM and no MissingFeatureError", err)
	}
	if k.txs != 1 {
		t.Errorf("probe went on after EPERM: %d transactions", k.txs)
	}
}

// On the real kernel (this machine's, and in the VM tier Debian 12's 6.1
// and Debian 11's 5.10): every feature is there, the probe leaves no table
// behind, and the echo check is real: a chain written without a comment
// comes back without one.
func TestKernelProbeFeatures(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	k, err := OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	start := time.Now()
	if err := k.ProbeFeatures(true); err != nil {
		t.Fatalf("probe on this kernel: %v", err)
	}
	t.Logf("probe: %d features x 2 families in %v", len(features()), time.Since(start))
	for _, f := range Families {
		err := k.dump(unix.NFT_MSG_GETTABLE, f, nil, func(p []byte) error {
			v, _ := findAttr(p, unix.NFTA_TABLE_NAME)
			t.Errorf("table %s %s left behind", f, strings.TrimRight(string(v), "\x00"))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	uncommented := feature{name: "chain comments", kernel: "NFTA_CHAIN_USERDATA", since: "5.10",
		write: func(b *batch, f Family, table string) {
			b.AddChain(f, table, &Chain{Name: "probe-comment"})
			b.echoLast()
		},
		kept: features()[len(features())-1].kept}
	b := k.startBatch()
	writeProbe(b, IPv4, scratchTableName(), uncommented)
	echo, err := k.probeApply(b)
	if err != nil {
		t.Fatal(err)
	}
	if uncommented.kept("", echo) {
		t.Errorf("a chain without a comment passed the chain comment check (%d echoed messages)", len(echo))
	}
}
