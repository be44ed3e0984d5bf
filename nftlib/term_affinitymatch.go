package nftlib

import (
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// AffinityMatch is `ip saddr . numgen random mod 1 offset ID @affinity`: the
// client has affinity to the endpoint with this id.
type AffinityMatch struct{ ID uint32 }

func (m AffinityMatch) text(f Family) string { return affinityKeyText(f, m.ID) + " @" + SetAffinity }

func (m AffinityMatch) exprs(f Family) []expr.Any {
	return append(affinityKey(f, m.ID), &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: SetAffinity})
}

// decode: the affinity key, looked up in the affinity set.
func (AffinityMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	id, ok := affinityKeyAt(f, ex)
	if !ok {
		return nil, 0, nil
	}
	l, ok := exprAt[*expr.Lookup](ex, 2)
	if !ok || l.SetName != SetAffinity || l.IsDestRegSet || l.Invert {
		return nil, 0, nil
	}
	return AffinityMatch{ID: id}, 3, nil
}

func (m AffinityMatch) eval(s *state, _ *Table, _ int) []result {
	return s.matchIf(slices.Contains(s.pkt.Affinity, m.ID))
}
