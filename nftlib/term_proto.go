package nftlib

import (
	"github.com/google/nftables/expr"
)

// ProtoMatch is `meta l4proto tcp`.
type ProtoMatch struct{ Proto uint8 }

func (m ProtoMatch) text(Family) string { return "meta l4proto " + ProtoName(m.Proto) }

func (m ProtoMatch) exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.Proto}},
	}
}

func (m ProtoMatch) direct(b *batch, _ Family) bool {
	b.meta(expr.MetaKeyL4PROTO, 1, false)
	b.cmp(1, expr.CmpOpEq, []byte{m.Proto})
	return true
}

func (ProtoMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	p, ok := protoMatchAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	return ProtoMatch{Proto: p}, 2, nil
}

// protoMatchAt reads a ProtoMatch's expressions at the start of ex (which
// SetLookup also begins with).
func protoMatchAt(f Family, ex []expr.Any) (uint8, bool) {
	if len(ex) == 0 {
		return 0, false
	}
	if fl, ok := fieldLoad(f, ex[0]); !ok || fl != FieldL4Proto {
		return 0, false
	}
	c, ok := cmpAt(ex, 1, expr.CmpOpEq)
	if !ok || len(c.Data) != 1 {
		return 0, false
	}
	return c.Data[0], true
}

func (m ProtoMatch) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(s.pkt.Proto == m.Proto)
}
