package nftlib

import (
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NumgenZero is `numgen random mod N 0`: true with probability 1/N.
type NumgenZero struct{ Mod uint32 }

func (n NumgenZero) text(Family) string { return fmt.Sprintf("numgen random mod %d 0", n.Mod) }

func (n NumgenZero) exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Numgen{Register: 1, Modulus: n.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

func (n NumgenZero) direct(b *batch, _ Family) bool {
	b.numgen(1, n.Mod, unix.NFT_NG_RANDOM, 0)
	var zero [4]byte
	b.cmp(1, expr.CmpOpEq, zero[:])
	return true
}

func (NumgenZero) decode(_ Family, ex []expr.Any) (Term, int, error) {
	ng, ok := exprAt[*expr.Numgen](ex, 0)
	if !ok || ng.Type != unix.NFT_NG_RANDOM || ng.Offset != 0 || ng.Modulus == 0 {
		return nil, 0, nil
	}
	c, ok := cmpAt(ex, 1, expr.CmpOpEq)
	if !ok {
		return nil, 0, nil
	}
	if v, isU32 := u32Of(c.Data); !isU32 || v != 0 {
		return nil, 0, nil
	}
	return NumgenZero{Mod: ng.Modulus}, 2, nil
}

// eval forks the branch: one in Mod matches.
func (n NumgenZero) eval(s *state, _ *Table, _ int) []result {
	if n.Mod == 0 { // the kernel refuses a modulus of 0
		return s.matchIf(false)
	}
	hit := s.fork(1 / float64(n.Mod))
	s.prob *= 1 - 1/float64(n.Mod)
	return []result{{hit, next}, {s, noMatch}}
}
