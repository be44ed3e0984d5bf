package nft

import (
	"bytes"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"golang.org/x/sys/unix"
)

// The direct encoder must produce exactly what google/nftables produces for
// every expression of every golden state.
func TestDirectEncodingMatchesLibrary(t *testing.T) {
	seen := 0
	for _, tc := range goldenCases() {
		for _, tbl := range Build(tc.st, tc.cfg).Tables {
			for _, c := range tbl.AllChains() {
				for _, r := range c.Rules {
					for _, term := range r.Terms {
						for _, e := range term.exprs(tbl.Family) {
							b := &batch{}
							b.expr(tbl.Family, e)
							data, err := expr.Marshal(byte(tbl.Family), e)
							if err != nil {
								t.Fatal(err)
							}
							lib := &batch{}
							lib.attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
							if !bytes.Equal(b.buf, lib.buf) {
								t.Errorf("%s %T %+v:\n direct %x\n library %x", tbl.Family, e, e, b.buf, lib.buf)
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
	tbl := Build(scaleState(700, 10), demoConfig()).Table(IPv4)
	chains := tbl.AllChains()
	if parallelParts(len(chains)) < 3 {
		t.Fatalf("%d chains make %d parts, want 3", len(chains), parallelParts(len(chains)))
	}
	for _, tail := range []bool{false, true} {
		encode := func(parallel bool) ([]byte, *batch) {
			b := newBatch(7)
			if parallel {
				b.addChains(IPv4, tbl.Name, chains)
				b.addChainRules(IPv4, tbl.Name, chains)
			} else {
				for _, c := range chains {
					b.addChain(IPv4, tbl.Name, c)
				}
				for _, c := range chains {
					for _, r := range c.Rules {
						b.addRule(IPv4, tbl.Name, c.Name, r)
					}
				}
			}
			if tail {
				m := tbl.Map(mapServiceIPs)
				b.elements(true, IPv4, tbl.Name, m, tbl.Elements(m.Name))
			}
			chunks, _, err := b.finish()
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
		if sb.messages() != pb.messages() || sb.describe(7+12000) != pb.describe(7+12000) {
			t.Errorf("message %d: %q, serial %q", 7+12000, pb.describe(7+12000), sb.describe(7+12000))
		}
	}
}

// A refused message is named by what its encoding says it does.
func TestDescribeMessage(t *testing.T) {
	m := &Map{Name: mapServiceIPs, Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}}
	b := newBatch(100)
	steps := []struct {
		write func()
		want  string
	}{
		{func() { b.addTable(IPv4, "t", "c") }, "add table t"},
		{func() { b.addMap(IPv4, "t", m, 1) }, "add map service-ips"},
		{func() { b.addAffinitySet(IPv4, "t", 2) }, "add set " + setAffinity},
		{func() { b.addChain(IPv4, "t", &Chain{Name: "KUBE-SVC-X"}) }, "add chain KUBE-SVC-X"},
		{func() { b.addRule(IPv4, "t", "KUBE-SVC-X", R(Verdict{Kind: Drop})) }, "add rule to KUBE-SVC-X"},
		{func() { b.flushChain(IPv4, "t", "KUBE-SVC-X") }, "flush chain KUBE-SVC-X"},
		{func() { b.flushMap(IPv4, "t", mapServiceIPs) }, "flush map service-ips"},
		{func() {
			b.elements(true, IPv4, "t", m, []Element{{Key: Key{Addr: mustAddr("10.0.0.1"), Proto: 6, Port: 80}}})
		}, "add elements to service-ips"},
		{func() {
			b.elements(false, IPv4, "t", m, []Element{{Key: Key{Addr: mustAddr("10.0.0.1"), Proto: 6, Port: 80}}})
		}, "delete elements from service-ips"},
		{func() { b.delChain(IPv4, "t", "KUBE-SVC-X") }, "delete chain KUBE-SVC-X"},
		{func() { b.delSet(IPv4, "t", mapServiceIPs) }, "delete set service-ips"},
		{func() { b.delTable(IPv4, "t") }, "delete table t"},
	}
	for i, s := range steps {
		s.write()
		if got := b.describe(uint32(101 + i)); got != s.want {
			t.Errorf("message %d: %q, want %q", 101+i, got, s.want)
		}
	}
	if _, _, err := b.finish(); err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint32]string{100: "batch begin", 101 + uint32(len(steps)): "batch end", 3: "message 3"} {
		if got := b.describe(seq); got != want {
			t.Errorf("message %d: %q, want %q", seq, got, want)
		}
	}
}

// Terms that encode themselves append exactly what their expressions do.
func TestDirectTermsMatchExprs(t *testing.T) {
	terms := []Term{
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.1.2.3/32")},
		AddrMatch{Field: FieldDaddr, Negate: true, Prefix: netip.MustParsePrefix("10.1.0.0/16")},
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.1.0.0/20")},
		AddrMatch{Field: FieldDaddr, Prefix: netip.MustParsePrefix("fd00::1/128")},
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("fd00::/56")},
		ProtoMatch{Proto: unix.IPPROTO_TCP}, ProtoMatch{Proto: unix.IPPROTO_SCTP},
		PortMatch{Port: 80}, PortMatch{Port: 65535},
		DNAT{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080}, DNAT{Addr: netip.MustParseAddr("fd00::1"), Port: 53},
		NumgenZero{Mod: 2}, NumgenZero{Mod: 1000},
		Verdict{Kind: Accept}, Verdict{Kind: Drop}, Verdict{Kind: Return}, JumpTo("KUBE-MARK-MASQ"), GotoChain("KUBE-SEP-X"),
	}
	for _, tc := range goldenCases() {
		for _, tbl := range Build(tc.st, tc.cfg).Tables {
			for _, c := range tbl.AllChains() {
				for _, r := range c.Rules {
					terms = append(terms, r.Terms...)
				}
			}
		}
	}
	seen := 0
	for _, f := range families {
		for _, term := range terms {
			d, ok := term.(directTerm)
			if !ok {
				continue
			}
			direct := &batch{}
			if !d.direct(direct, f) {
				if len(direct.buf) != 0 {
					t.Errorf("%s %T %+v: declined after appending %x", f, term, term, direct.buf)
				}
				continue
			}
			seen++
			viaExprs := &batch{}
			for _, e := range term.exprs(f) {
				viaExprs.expr(f, e)
			}
			if !bytes.Equal(direct.buf, viaExprs.buf) {
				t.Errorf("%s %T %+v:\n direct %x\n exprs  %x", f, term, term, direct.buf, viaExprs.buf)
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
	st := scaleState(3*parallelMin+5, 2)
	withAffinity(st, func(n proxier.ServicePortName) bool { return len(n.Name)%3 == 0 })
	b, err := NewBackend(nil, BackendConfig{Rules: demoConfig()})
	if err != nil {
		t.Fatal(err)
	}
	render := func(parallel bool) string {
		want := map[tableID]*Table{}
		for _, id := range tableIDs() {
			want[id] = BuildTable(id.f, b.cfg, st.Node, id.kind)
		}
		if parallel {
			b.placeAll(want, st)
		} else {
			for name, svc := range st.Services {
				b.place(want, name, homeTable(svc), st.Node, svc, st.Endpoints[name])
			}
		}
		var out strings.Builder
		for _, id := range tableIDs() {
			want[id].render(&out)
		}
		return out.String()
	}
	if parallelParts(len(st.Services)) != 3 {
		t.Fatalf("%d service ports make %d parts, want 3", len(st.Services), parallelParts(len(st.Services)))
	}
	if serial, par := render(false), render(true); serial != par {
		t.Errorf("the tables differ: %d bytes built in parallel, %d one by one", len(par), len(serial))
	}
}
