package nftlib

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Field is a packet field a rule or a map key reads.
type Field uint8

// The fields our rules read.
const (
	FieldSaddr   Field = iota // ip/ip6 saddr
	FieldDaddr                // ip/ip6 daddr
	FieldL4Proto              // meta l4proto
	FieldDport                // th dport (TCP, UDP and SCTP keep it at offset 2)
)

func (fl Field) text(f Family) string {
	switch fl {
	case FieldSaddr:
		return f.String() + " saddr"
	case FieldDaddr:
		return f.String() + " daddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldDport:
		return "th dport"
	}
	return "?"
}

// size is the field's length in bytes in a key.
func (fl Field) size(f Family) uint32 {
	switch fl {
	case FieldSaddr, FieldDaddr:
		return uint32(f.addrLen())
	case FieldL4Proto:
		return 1
	case FieldDport:
		return 2
	}
	return 0
}

// load emits the expression that loads the field into register reg.
func (fl Field) load(f Family, reg uint32) expr.Any {
	switch fl {
	case FieldSaddr, FieldDaddr:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: f.addrOffset(fl == FieldSaddr), Len: uint32(f.addrLen())}
	case FieldL4Proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}
	default:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}
}

// datatype is the nft type name and id of the field as a set key.
func (fl Field) datatype(f Family) (string, uint32) {
	switch fl {
	case FieldSaddr, FieldDaddr:
		if f == IPv6 {
			return "ipv6_addr", 8
		}
		return "ipv4_addr", 7
	case FieldL4Proto:
		return "inet_proto", 12
	}
	return "inet_service", 13
}

// fieldLoad is the field an expression loads, if it loads one of ours: the
// inverse of Field.load.
func fieldLoad(f Family, e expr.Any) (Field, bool) {
	switch e := e.(type) {
	case *expr.Payload:
		return payloadField(f, e)
	case *expr.Meta:
		return FieldL4Proto, e.Key == expr.MetaKeyL4PROTO && !e.SourceRegister
	}
	return 0, false
}

// fieldLoads are the fields loaded one after another from the start of ex.
func fieldLoads(f Family, ex []expr.Any) []Field {
	var out []Field
	for _, e := range ex {
		fl, ok := fieldLoad(f, e)
		if !ok {
			break
		}
		out = append(out, fl)
	}
	return out
}

func payloadField(f Family, p *expr.Payload) (Field, bool) {
	switch {
	case p.OperationType != expr.PayloadLoad:
		return 0, false
	case p.Base == expr.PayloadBaseTransportHeader && p.Offset == 2 && p.Len == 2:
		return FieldDport, true
	case p.Base != expr.PayloadBaseNetworkHeader || p.Len == 0 || int(p.Len) > f.addrLen():
		return 0, false
	case p.Offset == f.addrOffset(true):
		return FieldSaddr, true
	case p.Offset == f.addrOffset(false):
		return FieldDaddr, true
	}
	return 0, false
}

// keyLoads appends the loads of a lookup key to out: one field into
// register 1, or a concatenation in the 32-bit registers (8 =
// NFT_REG32_00), each field starting on a fresh one.
func keyLoads(out []expr.Any, f Family, key []Field) []expr.Any {
	if len(key) == 1 {
		return append(out, key[0].load(f, unix.NFT_REG_1))
	}
	reg := uint32(unix.NFT_REG32_00)
	for _, fl := range key {
		out = append(out, fl.load(f, reg))
		reg += (fl.size(f) + 3) / 4
	}
	return out
}

// keyMatches tells whether the packet's fields are the key's.
func (p *Packet) keyMatches(fields []Field, k Key) bool {
	addrs := 0
	for _, fl := range fields {
		var ok bool
		switch fl {
		case FieldDaddr, FieldSaddr:
			a := p.Dst
			if fl == FieldSaddr {
				a = p.Src
			}
			if addrs++; addrs == 1 {
				ok = a == k.Addr
			} else {
				ok = k.Net.Contains(a)
			}
		case FieldL4Proto:
			ok = p.Proto == k.Proto
		case FieldDport:
			ok = p.Dport == k.Port
		}
		if !ok {
			return false
		}
	}
	return true
}
