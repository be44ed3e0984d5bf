package nftlib

import (
	"fmt"

	"github.com/google/nftables/expr"
)

// MarkIsSet is `meta mark & BIT == BIT`.
type MarkIsSet struct{ Bit uint32 }

func (m MarkIsSet) text(Family) string {
	return fmt.Sprintf("meta mark & 0x%08x == 0x%08x", m.Bit, m.Bit)
}

func (m MarkIsSet) exprs(Family) []expr.Any { return markTest(m.Bit, m.Bit) }

// markTest is `meta mark & mask == want`, which MarkIsSet and MarkZero are.
func markTest(mask, want uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(mask), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(want)},
	}
}

// markTestAt reads markTest's expressions at the start of ex.
func markTestAt(ex []expr.Any) (mask, want uint32, ok bool) {
	m, ok := exprAt[*expr.Meta](ex, 0)
	if !ok || m.Key != expr.MetaKeyMARK || m.SourceRegister {
		return 0, 0, false
	}
	bw, ok := exprAt[*expr.Bitwise](ex, 1)
	if !ok {
		return 0, 0, false
	}
	if mask, ok = maskedU32(bw); !ok {
		return 0, 0, false
	}
	c, ok := cmpAt(ex, 2, expr.CmpOpEq)
	if !ok {
		return 0, 0, false
	}
	want, ok = u32Of(c.Data)
	return mask, want, ok
}

func (MarkIsSet) decode(_ Family, ex []expr.Any) (Term, int, error) {
	mask, want, ok := markTestAt(ex)
	if !ok || want != mask || mask == 0 {
		return nil, 0, nil
	}
	return MarkIsSet{Bit: mask}, 3, nil
}

func (m MarkIsSet) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(s.mark&m.Bit != 0)
}
