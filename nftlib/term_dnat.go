package nftlib

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables/expr"
)

// DNAT is `dnat to ADDR:PORT`; nft requires a protocol match before it.
type DNAT struct {
	Addr netip.Addr
	Port uint16
}

func (d DNAT) text(Family) string { return "dnat to " + netip.AddrPortFrom(d.Addr, d.Port).String() }

func (d DNAT) exprs(f Family) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: d.Addr.AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, d.Port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// direct writes a DNAT to an address of the family (every endpoint's rule).
func (d DNAT) direct(b *batch, f Family) bool {
	if d.Addr.Is4() != (f == IPv4) {
		return false
	}
	a := d.Addr.As16()
	addr := a[:]
	if d.Addr.Is4() {
		addr = addr[12:]
	}
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], d.Port)
	b.immediate(1, addr)
	b.immediate(2, port[:])
	b.nat(&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f), RegAddrMin: 1, RegProtoMin: 2, Specified: true})
	return true
}

// decode: the address and the port into registers, a destination NAT to them.
func (DNAT) decode(_ Family, ex []expr.Any) (Term, int, error) {
	addr, ok := exprAt[*expr.Immediate](ex, 0)
	if !ok {
		return nil, 0, nil
	}
	port, ok := exprAt[*expr.Immediate](ex, 1)
	if !ok || len(port.Data) != 2 {
		return nil, 0, nil
	}
	nat, ok := exprAt[*expr.NAT](ex, 2)
	if !ok || nat.Type != expr.NATTypeDestNAT {
		return nil, 0, nil
	}
	a, ok := netip.AddrFromSlice(addr.Data)
	if !ok {
		return nil, 0, nil
	}
	return DNAT{Addr: a, Port: binary.BigEndian.Uint16(port.Data)}, 3, nil
}

func (d DNAT) eval(s *state, _ *Table, _ int) []result {
	s.dnat = netip.AddrPortFrom(d.Addr, d.Port)
	return s.goOn()
}
