package nftlib

import (
	"fmt"

	"github.com/google/nftables/expr"
)

// MarkZero is `meta mark & BIT == 0x00000000`.
type MarkZero struct{ Bit uint32 }

func (m MarkZero) text(Family) string {
	return fmt.Sprintf("meta mark & 0x%08x == 0x00000000", m.Bit)
}

func (m MarkZero) exprs(Family) []expr.Any { return markTest(m.Bit, 0) }

func (MarkZero) decode(_ Family, ex []expr.Any) (Term, int, error) {
	mask, want, ok := markTestAt(ex)
	if !ok || want != 0 {
		return nil, 0, nil
	}
	return MarkZero{Bit: mask}, 3, nil
}

func (m MarkZero) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(s.mark&m.Bit == 0)
}
