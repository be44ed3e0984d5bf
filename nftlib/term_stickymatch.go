package nftlib

import (
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// StickyMatch is `ip saddr . numgen random mod 1 offset ID @affinity`: the
// packet's source is remembered for the target with this id (see
// StickyID).
type StickyMatch struct{ ID uint32 }

func (m StickyMatch) text(f Family) string { return stickyKeyText(f, m.ID) + " @" + SetSticky }

func (m StickyMatch) exprs(f Family) []expr.Any {
	return append(stickyKey(f, m.ID), &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: SetSticky})
}

// decode: the sticky key, looked up in the sticky set.
func (StickyMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	id, ok := stickyKeyAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	l, ok := exprAt[*expr.Lookup](ex, 2)
	if !ok || l.SetName != SetSticky || l.IsDestRegSet || l.Invert {
		return nil, 0, nil
	}
	return StickyMatch{ID: id}, 3, nil
}

func (m StickyMatch) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(slices.Contains(s.pkt.Sticky, m.ID))
}
