package nft

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
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

// Terms that encode themselves append exactly what their expressions do.
func TestDirectTermsMatchExprs(t *testing.T) {
	terms := []Term{
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.1.2.3/32")},
		AddrMatch{Field: FieldDaddr, Negate: true, Prefix: netip.MustParsePrefix("10.1.0.0/16")},
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.1.0.0/20")},
		AddrMatch{Field: FieldDaddr, Prefix: netip.MustParsePrefix("fd00::1/128")},
		AddrMatch{Field: FieldSaddr, Prefix: netip.MustParsePrefix("fd00::/56")},
		ProtoMatch{Proto: unix.IPPROTO_TCP}, ProtoMatch{Proto: unix.IPPROTO_SCTP},
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
