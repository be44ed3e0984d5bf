package nftlib

import (
	"github.com/google/nftables/expr"
)

// Masquerade is `masquerade fully-random`: source NAT to the outgoing
// interface's address, with fully random source ports.
type Masquerade struct{}

func (Masquerade) text(Family) string { return "masquerade fully-random" }

func (Masquerade) exprs(Family) []expr.Any { return []expr.Any{&expr.Masq{FullyRandom: true}} }

func (Masquerade) decode(_ Family, ex []expr.Any) (Term, int, error) {
	m, ok := exprAt[*expr.Masq](ex, 0)
	if !ok || !m.FullyRandom || m.Random || m.Persistent || m.ToPorts {
		return nil, 0, nil
	}
	return Masquerade{}, 1, nil
}

func (Masquerade) eval(s *state, _ *Table, _ int) []result {
	s.masq = true
	return s.goOn()
}
