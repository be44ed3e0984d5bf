package nftlib

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
)

// PortMatch is `th dport PORT`.
type PortMatch struct{ Port uint16 }

func (m PortMatch) text(Family) string { return fmt.Sprintf("th dport %d", m.Port) }

func (m PortMatch) exprs(f Family) []expr.Any {
	return []expr.Any{
		FieldDport.load(f, 1),
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, m.Port)},
	}
}

func (m PortMatch) direct(b *batch, _ Family) bool {
	b.payloadLoad(1, expr.PayloadBaseTransportHeader, 2, 2)
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], m.Port)
	b.cmp(1, expr.CmpOpEq, port[:])
	return true
}

func (PortMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	if len(ex) == 0 {
		return nil, 0, nil
	}
	if fl, ok := fieldLoad(f, ex[0]); !ok || fl != FieldDport {
		return nil, 0, nil
	}
	c, ok := cmpAt(ex, 1, expr.CmpOpEq)
	if !ok || len(c.Data) != 2 {
		return nil, 0, nil
	}
	return PortMatch{Port: binary.BigEndian.Uint16(c.Data)}, 2, nil
}

func (m PortMatch) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(s.pkt.Dport == m.Port)
}
