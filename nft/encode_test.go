package nft

import (
	"bytes"

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
