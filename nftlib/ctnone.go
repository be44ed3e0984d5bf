package nftlib

import (
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
)

// CtStatusDNAT is conntrack's IPS_DST_NAT status bit: the connection's
// destination was translated (iptables' virtual ctstate DNAT).
const CtStatusDNAT uint32 = 1 << 5

// CtStateNone is `ct state ! S[,S...]`: the connection is in none of the
// states. Together with CtStatusNone it writes iptables' `-m conntrack !
// --ctstate RELATED,ESTABLISHED,DNAT` (KUBE-FIREWALL's localnet guard).
type CtStateNone struct{ Bits uint32 }

func (m CtStateNone) Text(f Family) string {
	return "ct state ! " + strings.TrimPrefix(CtState(m).Text(f), "ct state ")
}

func (m CtStateNone) Exprs(Family) []expr.Any { return ctBitsClear(expr.CtKeySTATE, m.Bits) }

// CtStatusNone is `ct status ! S`: none of the status bits is set. A packet
// without a connection (invalid, untracked) matches no `ct status`, so a
// rule holding this term never matches it.
type CtStatusNone struct{ Bits uint32 }

func (m CtStatusNone) Text(Family) string {
	if m.Bits == CtStatusDNAT {
		return "ct status ! dnat"
	}
	return fmt.Sprintf("ct status & 0x%08x == 0x00000000", m.Bits)
}

func (m CtStatusNone) Exprs(Family) []expr.Any { return ctBitsClear(expr.CtKeySTATUS, m.Bits) }

// ctBitsClear loads a conntrack key and checks that none of bits is set,
// as nft writes `ct KEY ! BITS`.
func ctBitsClear(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(bits), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(0)},
	}
}

// ctTerm reads back a conntrack comparison of masked bits: `ct state S`
// (some bit set), `ct state ! S` or `ct status ! S` (none set).
func ctTerm(ct *expr.Ct, bw *expr.Bitwise, c *expr.Cmp, u32 func([]byte) uint32) (Term, error) {
	bits, clear := u32(bw.Mask), c.Op == expr.CmpOpEq && u32(c.Data) == 0
	switch {
	case ct.Key == expr.CtKeySTATE && !clear:
		return CtState{Bits: bits}, nil
	case ct.Key == expr.CtKeySTATE:
		return CtStateNone{Bits: bits}, nil
	case ct.Key == expr.CtKeySTATUS && clear:
		return CtStatusNone{Bits: bits}, nil
	}
	return nil, fmt.Errorf("ct key %d comparison is not one we write", ct.Key)
}
