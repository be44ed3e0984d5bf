package nftlib

import (
	"fmt"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// AffinityUpdate is `update @affinity { ip saddr . numgen random mod 1
// offset ID timeout T }`: the client gets (or keeps) affinity to the
// endpoint for T from now.
type AffinityUpdate struct {
	ID      uint32
	Timeout time.Duration
}

func (u AffinityUpdate) text(f Family) string {
	return fmt.Sprintf("update @%s { %s timeout %s }", SetAffinity, affinityKeyText(f, u.ID), NftDuration(u.Timeout))
}

func (u AffinityUpdate) exprs(f Family) []expr.Any {
	return append(affinityKey(f, u.ID), &expr.Dynset{
		SrcRegKey: unix.NFT_REG_1, SetName: SetAffinity, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: u.Timeout,
	})
}

// decode: the affinity key, written to the affinity set.
func (AffinityUpdate) decode(f Family, ex []expr.Any) (Term, int, error) {
	id, ok := affinityKeyAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	d, ok := exprAt[*expr.Dynset](ex, 2)
	if !ok || d.SetName != SetAffinity || d.Operation != unix.NFT_DYNSET_OP_UPDATE || d.Invert || len(d.Exprs) > 0 {
		return nil, 0, nil
	}
	return AffinityUpdate{ID: id, Timeout: d.Timeout}, 3, nil
}

func (u AffinityUpdate) eval(s *state, _ *Table, _ int) []result {
	s.affinity = u.ID
	return s.goOn()
}
