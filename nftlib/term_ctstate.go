package nftlib

import (
	"strings"

	"github.com/google/nftables/expr"
)

// Conntrack states, as the kernel numbers their bits.
const (
	CtInvalid     uint32 = 1
	CtEstablished uint32 = 2
	CtRelated     uint32 = 4
	CtNew         uint32 = 8
)

// CtState is `ct state S[,S...]`: the connection is in one of the states.
type CtState struct{ Bits uint32 }

func (m CtState) text(Family) string {
	var names []string
	for _, st := range []struct {
		bit  uint32
		name string
	}{{CtInvalid, "invalid"}, {CtEstablished, "established"}, {CtRelated, "related"}, {CtNew, "new"}} {
		if m.Bits&st.bit != 0 {
			names = append(names, st.name)
		}
	}
	return "ct state " + strings.Join(names, ",")
}

func (m CtState) exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(m.Bits), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
	}
}

// decode: the state loaded, masked to the states, compared with none.
func (CtState) decode(_ Family, ex []expr.Any) (Term, int, error) {
	ct, ok := exprAt[*expr.Ct](ex, 0)
	if !ok || ct.Key != expr.CtKeySTATE || ct.SourceRegister {
		return nil, 0, nil
	}
	bw, ok := exprAt[*expr.Bitwise](ex, 1)
	if !ok {
		return nil, 0, nil
	}
	bits, ok := maskedU32(bw)
	if !ok {
		return nil, 0, nil
	}
	c, ok := cmpAt(ex, 2, expr.CmpOpNeq)
	if !ok {
		return nil, 0, nil
	}
	if v, isU32 := u32Of(c.Data); !isU32 || v != 0 {
		return nil, 0, nil
	}
	return CtState{Bits: bits}, 3, nil
}

func (m CtState) eval(s *state, _ *Table, _ int) []result {
	// Trace follows the first packet of a connection.
	return s.matchIf(m.Bits&CtNew != 0)
}
