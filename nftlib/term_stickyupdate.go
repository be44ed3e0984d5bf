package nftlib

import (
	"fmt"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// StickyUpdate is `update @SET { ip saddr . numgen random mod 1 offset ID
// timeout T }`: the packet's source is remembered in the sticky set SET
// (Table.Sticky) for the target with this id for T from now.
type StickyUpdate struct {
	Set     string
	ID      uint32
	Timeout time.Duration
}

func (u StickyUpdate) text(f Family) string {
	return fmt.Sprintf("update @%s { %s timeout %s }", u.Set, stickyKeyText(f, u.ID), nftDuration(u.Timeout))
}

func (u StickyUpdate) exprs(f Family) []expr.Any {
	return append(stickyKey(f, u.ID), &expr.Dynset{
		SrcRegKey: unix.NFT_REG_1, SetName: u.Set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: u.Timeout,
	})
}

// decode: the sticky key, written to the sticky set.
func (StickyUpdate) decode(f Family, ex []expr.Any) (Term, int, error) {
	id, ok := stickyKeyAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	d, ok := exprAt[*expr.Dynset](ex, 2)
	if !ok || d.Operation != unix.NFT_DYNSET_OP_UPDATE || d.Invert || len(d.Exprs) > 0 {
		return nil, 0, nil
	}
	return StickyUpdate{Set: d.SetName, ID: id, Timeout: d.Timeout}, 3, nil
}

func (u StickyUpdate) eval(s *state, _ *Table, _ int) []result {
	s.sticky = u.ID
	return s.goOn()
}
