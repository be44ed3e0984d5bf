package nftlib

import (
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/google/nftables/expr"
)

// AddrMatch matches the source or destination address against a prefix
// (a single address is a full-length prefix).
type AddrMatch struct {
	Field  Field // FieldSaddr or FieldDaddr
	Negate bool
	Prefix netip.Prefix
}

func (m AddrMatch) text(f Family) string {
	op := ""
	if m.Negate {
		op = "!= "
	}
	v := m.Prefix.String()
	if m.Prefix.IsSingleIP() {
		v = m.Prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s%s", m.Field.text(f), op, v)
}

func (m AddrMatch) exprs(f Family) []expr.Any {
	addr := m.Prefix.Addr().AsSlice()
	bits := m.Prefix.Bits()
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	off := f.addrOffset(m.Field == FieldSaddr)
	if bits%8 == 0 {
		// nft loads only the prefix's whole bytes and compares them.
		n := uint32(bits / 8)
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Cmp{Op: op, Register: 1, Data: addr[:n]},
		}
	}
	mask := make([]byte, len(addr))
	for i := range mask {
		switch {
		case bits >= 8*(i+1):
			mask[i] = 0xff
		case bits > 8*i:
			mask[i] = byte(0xff << (8 - (bits - 8*i)))
		}
	}
	masked := make([]byte, len(addr))
	for i := range addr {
		masked[i] = addr[i] & mask[i]
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: op, Register: 1, Data: masked},
	}
}

// direct writes a whole-byte prefix of the family's address kind; the
// others go through exprs.
func (m AddrMatch) direct(b *batch, f Family) bool {
	bits := m.Prefix.Bits()
	if bits%8 != 0 || m.Prefix.Addr().Is4() != (f == IPv4) {
		return false
	}
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	a := m.Prefix.Addr().As16()
	addr := a[:]
	if f == IPv4 {
		addr = addr[12:]
	}
	n := uint32(bits / 8)
	b.payloadLoad(1, expr.PayloadBaseNetworkHeader, f.addrOffset(m.Field == FieldSaddr), n)
	b.cmp(1, op, addr[:n])
	return true
}

// decode: a load of (part of) the address, a mask for a prefix that is not
// whole bytes, a comparison.
func (AddrMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	p, ok := exprAt[*expr.Payload](ex, 0)
	if !ok {
		return nil, 0, nil
	}
	fl, ok := payloadField(f, p)
	if !ok || (fl != FieldSaddr && fl != FieldDaddr) {
		return nil, 0, nil
	}
	i := 1
	bw, masked := exprAt[*expr.Bitwise](ex, i)
	if masked {
		i++
	}
	c, ok := cmpAt(ex, i, expr.CmpOpEq, expr.CmpOpNeq)
	if !ok || len(c.Data) > f.addrLen() {
		return nil, 0, nil
	}
	full := make([]byte, f.addrLen())
	copy(full, c.Data)
	a, _ := netip.AddrFromSlice(full)
	n := 8 * len(c.Data)
	if masked {
		n = 0
		for _, m := range bw.Mask {
			n += bits.OnesCount8(m)
		}
	}
	return AddrMatch{Field: fl, Negate: c.Op == expr.CmpOpNeq, Prefix: netip.PrefixFrom(a, n)}, i + 1, nil
}

func (m AddrMatch) eval(s *state, _ *Table, _ int) []result {
	a := s.pkt.Src
	if m.Field == FieldDaddr {
		a = s.pkt.Dst
	}
	return s.matchIf(m.Prefix.Contains(a) != m.Negate)
}
