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
// --ctstate RELATED,ESTABLISHED,DNAT`.
type CtStateNone struct{ Bits uint32 }

func (m CtStateNone) text(f Family) string {
	return "ct state ! " + strings.TrimPrefix(CtState(m).text(f), "ct state ")
}

func (m CtStateNone) exprs(Family) []expr.Any { return ctBitsClear(expr.CtKeySTATE, m.Bits) }

func (CtStateNone) decode(_ Family, ex []expr.Any) (Term, int, error) {
	bits, n := decodeCtBitsClear(expr.CtKeySTATE, ex)
	if n == 0 {
		return nil, 0, nil
	}
	return CtStateNone{Bits: bits}, n, nil
}

func (m CtStateNone) eval(s *state, _ *Table, _ int) []result {
	// Trace follows the first packet of a connection.
	return s.matchIf(m.Bits&CtNew == 0)
}

// CtStatusNone is `ct status ! S`: none of the status bits is set. A packet
// without a connection (invalid, untracked) matches no `ct status`, so a
// rule holding this term never matches it.
type CtStatusNone struct{ Bits uint32 }

func (m CtStatusNone) text(Family) string {
	if m.Bits == CtStatusDNAT {
		return "ct status ! dnat"
	}
	return fmt.Sprintf("ct status & 0x%08x == 0x00000000", m.Bits)
}

func (m CtStatusNone) exprs(Family) []expr.Any { return ctBitsClear(expr.CtKeySTATUS, m.Bits) }

func (CtStatusNone) decode(_ Family, ex []expr.Any) (Term, int, error) {
	bits, n := decodeCtBitsClear(expr.CtKeySTATUS, ex)
	if n == 0 {
		return nil, 0, nil
	}
	return CtStatusNone{Bits: bits}, n, nil
}

func (m CtStatusNone) eval(s *state, _ *Table, _ int) []result {
	// Only DNAT is written: a packet the trace has DNATed has it set.
	return s.matchIf(m.Bits&CtStatusDNAT == 0 || !s.dnat.IsValid())
}

// ctBitsClear loads a conntrack key and checks that none of bits is set,
// as nft writes `ct KEY ! BITS` (not `!=`, which compares the whole word).
func ctBitsClear(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(bits), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(0)},
	}
}

// decodeCtBitsClear recognises ctBitsClear's expressions for key at the
// start of ex: the bits and 3, or 0 when they are not there.
func decodeCtBitsClear(key expr.CtKey, ex []expr.Any) (uint32, int) {
	ct, ok := exprAt[*expr.Ct](ex, 0)
	if !ok || ct.Key != key || ct.SourceRegister {
		return 0, 0
	}
	bw, ok := exprAt[*expr.Bitwise](ex, 1)
	if !ok {
		return 0, 0
	}
	bits, ok := maskedU32(bw)
	if !ok {
		return 0, 0
	}
	c, ok := cmpAt(ex, 2, expr.CmpOpEq)
	if !ok {
		return 0, 0
	}
	if v, isU32 := u32Of(c.Data); !isU32 || v != 0 {
		return 0, 0
	}
	return bits, 3
}
