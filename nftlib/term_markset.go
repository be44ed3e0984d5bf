package nftlib

import (
	"fmt"

	"github.com/google/nftables/expr"
)

// MarkSet sets (`meta mark set meta mark | BIT`) or toggles
// (`meta mark set meta mark ^ BIT`) the masquerade bit.
type MarkSet struct {
	Bit    uint32
	Toggle bool
}

func (m MarkSet) text(Family) string {
	op := "|"
	if m.Toggle {
		op = "^"
	}
	return fmt.Sprintf("meta mark set meta mark %s 0x%08x", op, m.Bit)
}

func (m MarkSet) exprs(Family) []expr.Any {
	mask, xor := ^m.Bit, m.Bit // x | b == (x & ^b) ^ b
	if m.Toggle {
		mask = 0xffffffff
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(mask), Xor: le32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

// decode: the mark loaded, changed by (mask, xor), stored.
func (MarkSet) decode(_ Family, ex []expr.Any) (Term, int, error) {
	load, ok := exprAt[*expr.Meta](ex, 0)
	if !ok || load.Key != expr.MetaKeyMARK || load.SourceRegister {
		return nil, 0, nil
	}
	bw, ok := exprAt[*expr.Bitwise](ex, 1)
	if !ok {
		return nil, 0, nil
	}
	store, ok := exprAt[*expr.Meta](ex, 2)
	if !ok || store.Key != expr.MetaKeyMARK || !store.SourceRegister {
		return nil, 0, nil
	}
	mask, mok := u32Of(bw.Mask)
	xor, xok := u32Of(bw.Xor)
	if !mok || !xok || (mask != ^xor && mask != 0xffffffff) {
		return nil, 0, nil
	}
	return MarkSet{Bit: xor, Toggle: mask == 0xffffffff}, 3, nil
}

func (m MarkSet) eval(s *state, _ *Table, _ int) []result {
	if m.Toggle {
		s.mark ^= m.Bit
	} else {
		s.mark |= m.Bit
	}
	return s.goOn()
}
