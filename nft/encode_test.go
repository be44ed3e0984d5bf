package nft

import (
	"bytes"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"golang.org/x/sys/unix"
)

// The direct encoder must produce exactly what google/nftables produces for
// every expression of every golden state.
func TestDirectEncodingMatchesLibrary(t *testing.T) {
	seen := 0
	for _, tc := range goldenCases(t) {
		for _, tbl := range Build(tc.st, tc.cfg).Tables {
			for _, c := range tbl.AllChains() {
				for _, r := range c.Rules {
					for _, term := range r.Terms {
						for _, e := range term.Exprs(tbl.Family) {
							b := &nftlib.Batch{}
							b.Expr(tbl.Family, e)
							data, err := expr.Marshal(byte(tbl.Family), e)
							if err != nil {
								t.Fatal(err)
							}
							lib := &nftlib.Batch{}
							lib.Attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
							if !bytes.Equal(b.Buf, lib.Buf) {
								t.Errorf("%s %T %+v:\n direct %x\n library %x", tbl.Family, e, e, b.Buf, lib.Buf)
							}
							seen++
						}
					}
				}
			}
		}
	}
	if seen < 50 {
		t.Fatalf("only %d expressions checked", seen)
	}

}

// A transaction encoded on several CPUs is byte for byte the one encoded
// on one, with each message's sequence number and description in place,
// whether the rules end the batch or elements follow them.
func TestParallelEncodingMatchesSerial(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	tbl := Build(scaleState(700, 10), demoConfig()).Table(nftlib.IPv4)
	chains := tbl.AllChains()
	if nftlib.ParallelParts(len(chains)) < 3 {
		t.Fatalf("%d chains make %d parts, want 3", len(chains), nftlib.ParallelParts(len(chains)))
	}
	for _, tail := range []bool{false, true} {
		encode := func(parallel bool) ([]byte, *nftlib.Batch) {
			b := nftlib.NewBatch(7)
			if parallel {
				b.AddChains(nftlib.IPv4, tbl.Name, chains)
				b.AddChainRules(nftlib.IPv4, tbl.Name, chains)
			} else {
				for _, c := range chains {
					b.AddChain(nftlib.IPv4, tbl.Name, c)
				}
				for _, c := range chains {
					for _, r := range c.Rules {
						b.AddRule(nftlib.IPv4, tbl.Name, c.Name, r)
					}
				}
			}
			if tail {
				m := tbl.Map(mapServiceIPs)
				b.Elements(true, nftlib.IPv4, tbl.Name, m, tbl.Elements(m.Name))
			}
			chunks, _, err := b.Finish()
			if err != nil {
				t.Fatal(err)
			}
			return bytes.Join(chunks, nil), b
		}
		serial, sb := encode(false)
		par, pb := encode(true)
		if !bytes.Equal(serial, par) {
			t.Fatalf("elements after the rules=%v: the parallel encoding differs (%d bytes, serial %d)", tail, len(par), len(serial))
		}
		if sb.Messages() != pb.Messages() || sb.Describe(7+12000) != pb.Describe(7+12000) {
			t.Errorf("message %d: %q, serial %q", 7+12000, pb.Describe(7+12000), sb.Describe(7+12000))
		}
	}
}

// A refused message is named by what its encoding says it does.
func TestDescribeMessage(t *testing.T) {
	m := &nftlib.Map{Name: mapServiceIPs, Key: []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport}}
	b := nftlib.NewBatch(100)
	steps := []struct {
		write func()
		want  string
	}{
		{func() { b.AddTable(nftlib.IPv4, "t", "c") }, "add table t"},
		{func() { b.AddMap(nftlib.IPv4, "t", m, 1) }, "add map service-ips"},
		{func() { b.AddAffinitySet(nftlib.IPv4, "t", 2) }, "add set " + nftlib.SetAffinity},
		{func() { b.AddChain(nftlib.IPv4, "t", &nftlib.Chain{Name: "KUBE-SVC-X"}) }, "add chain KUBE-SVC-X"},
		{func() { b.AddRule(nftlib.IPv4, "t", "KUBE-SVC-X", nftlib.R(nftlib.Verdict{Kind: nftlib.Drop})) }, "add rule to KUBE-SVC-X"},
		{func() { b.FlushChain(nftlib.IPv4, "t", "KUBE-SVC-X") }, "flush chain KUBE-SVC-X"},
		{func() { b.FlushMap(nftlib.IPv4, "t", m) }, "flush map service-ips"},
		{func() {
			b.Elements(true, nftlib.IPv4, "t", m, []nftlib.Element{{Key: nftlib.Key{Addr: mustAddr("10.0.0.1"), Proto: 6, Port: 80}}})
		}, "add elements to service-ips"},
		{func() {
			b.Elements(false, nftlib.IPv4, "t", m, []nftlib.Element{{Key: nftlib.Key{Addr: mustAddr("10.0.0.1"), Proto: 6, Port: 80}}})
		}, "delete elements from service-ips"},
		{func() { b.DelChain(nftlib.IPv4, "t", "KUBE-SVC-X") }, "delete chain KUBE-SVC-X"},
		{func() { b.DelSet(nftlib.IPv4, "t", mapServiceIPs) }, "delete set service-ips"},
		{func() { b.DelTable(nftlib.IPv4, "t") }, "delete table t"},
	}
	for i, s := range steps {
		s.write()
		if got := b.Describe(uint32(101 + i)); got != s.want {
			t.Errorf("message %d: %q, want %q", 101+i, got, s.want)
		}
	}
	if _, _, err := b.Finish(); err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint32]string{100: "batch begin", 101 + uint32(len(steps)): "batch end", 3: "message 3"} {
		if got := b.Describe(seq); got != want {
			t.Errorf("message %d: %q, want %q", seq, got, want)
		}
	}
}

// Terms that encode themselves append exactly what their expressions do.
func TestDirectTermsMatchExprs(t *testing.T) {
	terms := []nftlib.Term{
		nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: netip.MustParsePrefix("10.1.2.3/32")},
		nftlib.AddrMatch{Field: nftlib.FieldDaddr, Negate: true, Prefix: netip.MustParsePrefix("10.1.0.0/16")},
		nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: netip.MustParsePrefix("10.1.0.0/20")},
		nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: netip.MustParsePrefix("fd00::1/128")},
		nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: netip.MustParsePrefix("fd00::/56")},
		nftlib.ProtoMatch{Proto: unix.IPPROTO_TCP}, nftlib.ProtoMatch{Proto: unix.IPPROTO_SCTP},
		nftlib.PortMatch{Port: 80}, nftlib.PortMatch{Port: 65535},
		nftlib.DNAT{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080}, nftlib.DNAT{Addr: netip.MustParseAddr("fd00::1"), Port: 53},
		nftlib.NumgenZero{Mod: 2}, nftlib.NumgenZero{Mod: 1000},
		nftlib.Verdict{Kind: nftlib.Accept}, nftlib.Verdict{Kind: nftlib.Drop}, nftlib.Verdict{Kind: nftlib.Return}, nftlib.JumpTo("KUBE-MARK-MASQ"), nftlib.GotoChain("KUBE-SEP-X"),
	}
	for _, tc := range goldenCases(t) {
		for _, tbl := range Build(tc.st, tc.cfg).Tables {
			for _, c := range tbl.AllChains() {
				for _, r := range c.Rules {
					terms = append(terms, r.Terms...)
				}
			}
		}
	}
	seen := 0
	for _, f := range nftlib.Families {
		for _, term := range terms {
			d, ok := term.(nftlib.DirectTerm)
			if !ok {
				continue
			}
			direct := &nftlib.Batch{}
			if !d.Direct(direct, f) {
				if len(direct.Buf) != 0 {
					t.Errorf("%s %T %+v: declined after appending %x", f, term, term, direct.Buf)
				}
				continue
			}
			seen++
			viaExprs := &nftlib.Batch{}
			for _, e := range term.Exprs(f) {
				viaExprs.Expr(f, e)
			}
			if !bytes.Equal(direct.Buf, viaExprs.Buf) {
				t.Errorf("%s %T %+v:\n direct %x\n exprs  %x", f, term, term, direct.Buf, viaExprs.Buf)
			}
		}
	}
	if seen < 50 {
		t.Fatalf("only %d terms encoded directly", seen)
	}
}

// A full sync's fragments built on several CPUs are those built one by one.
func TestPlaceAllMatchesPlace(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	st := scaleState(3*nftlib.ParallelMin+5, 2)
	withAffinity(st, func(n proxier.ServicePortName) bool { return len(n.Name)%3 == 0 })
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
		var out strings.Builder
		for _, id := range tableIDs() {
			want[id].RenderTo(&out)
		}
		return out.String()
	}
	if nftlib.ParallelParts(st.Services.Len()) != 3 {
		t.Fatalf("%d service ports make %d parts, want 3", st.Services.Len(), nftlib.ParallelParts(st.Services.Len()))
	}
	if serial, par := render(false), render(true); serial != par {
		t.Errorf("the tables differ: %d bytes built in parallel, %d one by one", len(par), len(serial))
	}
}
