package nftlib

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// FibLocal is `fib daddr type local` (the destination is one of the node's
// addresses) or, with Saddr, `fib saddr type local` (the node sent it).
type FibLocal struct{ Saddr bool }

func (m FibLocal) text(Family) string {
	if m.Saddr {
		return "fib saddr type local"
	}
	return "fib daddr type local"
}

func (m FibLocal) exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: !m.Saddr, FlagSADDR: m.Saddr, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

func (FibLocal) decode(_ Family, ex []expr.Any) (Term, int, error) {
	fib, ok := exprAt[*expr.Fib](ex, 0)
	if !ok || !fib.ResultADDRTYPE || fib.FlagSADDR == fib.FlagDADDR || fib.FlagIIF || fib.FlagOIF || fib.FlagMARK {
		return nil, 0, nil
	}
	c, ok := cmpAt(ex, 1, expr.CmpOpEq)
	if !ok {
		return nil, 0, nil
	}
	if v, isU32 := u32Of(c.Data); !isU32 || v != unix.RTN_LOCAL {
		return nil, 0, nil
	}
	return FibLocal{Saddr: fib.FlagSADDR}, 2, nil
}

func (m FibLocal) eval(s *state, _ *Table, _ int) []result {
	a := s.pkt.Dst
	if m.Saddr {
		a = s.pkt.Src
	}
	return s.matchIf(isLocal(a, s.pkt.Local))
}
