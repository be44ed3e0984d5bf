package nftlib

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Reject is `reject`: an ICMP port unreachable, which a TCP or UDP client
// sees as "connection refused" at once.
type Reject struct{}

func (Reject) text(Family) string { return "reject" }

func (Reject) exprs(f Family) []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: rejectCode(f)}}
}

// rejectCode is the family's ICMP port unreachable code.
func rejectCode(f Family) uint8 {
	if f == IPv6 {
		return 4 // ICMPV6_PORT_UNREACH
	}
	return 3 // ICMP_PORT_UNREACH
}

func (Reject) decode(f Family, ex []expr.Any) (Term, int, error) {
	r, ok := exprAt[*expr.Reject](ex, 0)
	if !ok || r.Type != unix.NFT_REJECT_ICMP_UNREACH || r.Code != rejectCode(f) {
		return nil, 0, nil
	}
	return Reject{}, 1, nil
}

func (Reject) eval(s *state, _ *Table, _ int) []result {
	s.dropped, s.rejected = true, true
	return []result{{s, final}}
}
