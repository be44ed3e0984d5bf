package nftlib

import (
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// StickyMatch is `ip saddr . numgen random mod 1 offset ID @SET`: the
// packet's source is remembered in the sticky set SET (Table.Sticky) for
// the target with this id (see StickyID).
type StickyMatch struct {
	Set string
	ID  uint32
}

func (m StickyMatch) text(f Family) string { return stickyKeyText(f, m.ID) + " @" + m.Set }

func (m StickyMatch) exprs(f Family) []expr.Any {
	return append(stickyKey(f, m.ID), &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: m.Set})
}

// decode: the sticky key, looked up in the sticky set.
func (StickyMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	id, ok := stickyKeyAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	l, ok := exprAt[*expr.Lookup](ex, 2)
	if !ok || l.IsDestRegSet || l.Invert {
		return nil, 0, nil
	}
	return StickyMatch{Set: l.SetName, ID: id}, 3, nil
}

func (m StickyMatch) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(slices.Contains(s.pkt.Sticky, m.ID))
}
