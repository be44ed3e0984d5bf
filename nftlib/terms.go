package nftlib

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A Term is one piece of a rule: a match, a statement or a verdict. Each term
// knows its nft text (exactly as `nft list ruleset` prints it) and the
// netlink expressions `nft` itself would emit for that text, so that what we
// render, what the tracer evaluates and what the kernel runs are one object.
//
// Terms are plain comparable values: two rules are equal when their terms
// are, which is how the diff decides what changed.
type Term interface {
	Text(f Family) string
	Exprs(f Family) []expr.Any
}

// Field is a packet field a rule or a map key reads.
type Field uint8

// The fields our rules read.
const (
	FieldSaddr   Field = iota // ip/ip6 saddr
	FieldDaddr                // ip/ip6 daddr
	FieldL4Proto              // meta l4proto
	FieldDport                // th dport (TCP, UDP and SCTP keep it at offset 2)
)

func (fl Field) Text(f Family) string {
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

// Size is the field's length in bytes in a key.
func (fl Field) Size(f Family) uint32 {
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

// AddrMatch matches the source or destination address against a prefix
// (a single address is a full-length prefix).
type AddrMatch struct {
	Field  Field // FieldSaddr or FieldDaddr
	Negate bool
	Prefix netip.Prefix
}

func (m AddrMatch) Text(f Family) string {
	op := ""
	if m.Negate {
		op = "!= "
	}
	v := m.Prefix.String()
	if m.Prefix.IsSingleIP() {
		v = m.Prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s%s", m.Field.Text(f), op, v)
}

func (m AddrMatch) Exprs(f Family) []expr.Any {
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

// ProtoMatch is `meta l4proto tcp`.
type ProtoMatch struct{ Proto uint8 }

func (m ProtoMatch) Text(Family) string { return "meta l4proto " + ProtoName(m.Proto) }

func (m ProtoMatch) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.Proto}},
	}
}

// FibLocal is `fib daddr type local` (the destination is one of the node's
// addresses) or, with Saddr, `fib saddr type local` (the node sent it).
type FibLocal struct{ Saddr bool }

func (m FibLocal) Text(Family) string {
	if m.Saddr {
		return "fib saddr type local"
	}
	return "fib daddr type local"
}

func (m FibLocal) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: !m.Saddr, FlagSADDR: m.Saddr, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

// PortMatch is `th dport PORT`.
type PortMatch struct{ Port uint16 }

func (m PortMatch) Text(Family) string { return fmt.Sprintf("th dport %d", m.Port) }

func (m PortMatch) Exprs(f Family) []expr.Any {
	return []expr.Any{
		FieldDport.load(f, 1),
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, m.Port)},
	}
}

// Conntrack states, as the kernel numbers their bits.
const (
	CtInvalid     uint32 = 1
	CtEstablished uint32 = 2
	CtRelated     uint32 = 4
	CtNew         uint32 = 8
)

// CtState is `ct state S[,S...]`: the connection is in one of the states.
type CtState struct{ Bits uint32 }

func (m CtState) Text(Family) string {
	var names []string
	for _, st := range []struct {
		bit  uint32
		name string
	}{{CtInvalid, "invalid"}, {CtEstablished, "established"}, {CtRelated, "related"}, {CtNew, "new"}} {
		if m.Bits&st.bit != 0 {
			names = append(names, st.name)
		}
	}
	return "ct state " + strings.Join(names, ",")
}

func (m CtState) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(m.Bits), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
	}
}

// MarkIsSet is `meta mark & BIT == BIT`.
type MarkIsSet struct{ Bit uint32 }

func (m MarkIsSet) Text(Family) string {
	return fmt.Sprintf("meta mark & 0x%08x == 0x%08x", m.Bit, m.Bit)
}

func (m MarkIsSet) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(m.Bit), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(m.Bit)},
	}
}

// IfName is `iifname "NAME"`, or with Prefix `iifname "NAME*"` (any
// interface whose name starts with NAME); Negate makes it `!=`.
type IfName struct {
	Name   string
	Prefix bool
	Negate bool
}

func (m IfName) Text(Family) string {
	op, name := "", m.Name
	if m.Negate {
		op = "!= "
	}
	if m.Prefix {
		name += "*"
	}
	return fmt.Sprintf("iifname %s%s", op, strconv.Quote(name))
}

func (m IfName) Exprs(Family) []expr.Any {
	data := []byte(m.Name)
	if !m.Prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, m.Name)
	}
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// SetMatch is `ip daddr @SET`: the address is in a named set of the table.
type SetMatch struct {
	Field Field
	Set   string
}

func (m SetMatch) Text(f Family) string { return m.Field.Text(f) + " @" + m.Set }

func (m SetMatch) Exprs(f Family) []expr.Any {
	return []expr.Any{m.Field.load(f, 1), &expr.Lookup{SourceRegister: 1, SetName: m.Set}}
}

// Reject is `reject`: an ICMP port unreachable, which a TCP or UDP client
// sees as "connection refused" at once.
type Reject struct{}

func (Reject) Text(Family) string { return "reject" }

func (Reject) Exprs(f Family) []expr.Any {
	code := uint8(3) // ICMP_PORT_UNREACH
	if f == IPv6 {
		code = 4 // ICMPV6_PORT_UNREACH
	}
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code}}
}

// VmapLookup is `<key fields> vmap @map`: the map's verdict for the packet's key.
type VmapLookup struct {
	Key [4]Field // up to 4 fields, NumKey used
	N   int
	Map string
}

// Vmap builds a VmapLookup over the given key fields.
func Vmap(m string, key ...Field) VmapLookup {
	v := VmapLookup{Map: m, N: len(key)}
	copy(v.Key[:], key)
	return v
}

func (v VmapLookup) fields() []Field { return v.Key[:v.N] }

func (v VmapLookup) Text(f Family) string {
	s := ""
	for i, fl := range v.fields() {
		if i > 0 {
			s += " . "
		}
		s += fl.Text(f)
	}
	return s + " vmap @" + v.Map
}

func (v VmapLookup) Exprs(f Family) []expr.Any {
	var out []expr.Any
	if v.N == 1 {
		out = append(out, v.Key[0].load(f, 1))
	} else {
		// Concatenations use the 32-bit registers (8 = NFT_REG32_00),
		// each field starting on a fresh one.
		reg := uint32(unix.NFT_REG32_00)
		for _, fl := range v.fields() {
			out = append(out, fl.load(f, reg))
			reg += (fl.Size(f) + 3) / 4
		}
	}
	return append(out, &expr.Lookup{SourceRegister: 1, SetName: v.Map, IsDestRegSet: true, DestRegister: 0})
}

// NumgenZero is `numgen random mod N 0`: true with probability 1/N.
type NumgenZero struct{ Mod uint32 }

func (n NumgenZero) Text(Family) string { return fmt.Sprintf("numgen random mod %d 0", n.Mod) }

func (n NumgenZero) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Numgen{Register: 1, Modulus: n.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

// MarkZero is `meta mark & BIT == 0x00000000`.
type MarkZero struct{ Bit uint32 }

func (m MarkZero) Text(Family) string {
	return fmt.Sprintf("meta mark & 0x%08x == 0x00000000", m.Bit)
}

func (m MarkZero) Exprs(Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(m.Bit), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(0)},
	}
}

// MarkSet sets (`meta mark set meta mark | BIT`) or toggles
// (`meta mark set meta mark ^ BIT`) the masquerade bit.
type MarkSet struct {
	Bit    uint32
	Toggle bool
}

func (m MarkSet) Text(Family) string {
	op := "|"
	if m.Toggle {
		op = "^"
	}
	return fmt.Sprintf("meta mark set meta mark %s 0x%08x", op, m.Bit)
}

func (m MarkSet) Exprs(Family) []expr.Any {
	mask, xor := ^m.Bit, m.Bit // x | b == (x & ^b) ^ b
	if m.Toggle {
		mask = 0xffffffff
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(mask), Xor: le32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

// DNAT is `dnat to ADDR:PORT`; nft requires a protocol match before it.
type DNAT struct {
	Addr netip.Addr
	Port uint16
}

func (d DNAT) Text(Family) string { return "dnat to " + netip.AddrPortFrom(d.Addr, d.Port).String() }

func (d DNAT) Exprs(f Family) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: d.Addr.AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, d.Port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// Masquerade is `masquerade fully-random`, as kube-proxy does by default.
type Masquerade struct{}

func (Masquerade) Text(Family) string { return "masquerade fully-random" }

func (Masquerade) Exprs(Family) []expr.Any { return []expr.Any{&expr.Masq{FullyRandom: true}} }

// VerdictKind is what a verdict does.
type VerdictKind uint8

// The verdicts our rules use.
const (
	Accept VerdictKind = iota
	Drop
	Return
	Jump
	Goto
)

// Verdict ends a rule (jump/goto CHAIN, return, accept, drop).
type Verdict struct {
	Kind  VerdictKind
	Chain string
}

// JumpTo and GotoChain are shorthands for the common verdicts.
func JumpTo(chain string) Verdict    { return Verdict{Kind: Jump, Chain: chain} }
func GotoChain(chain string) Verdict { return Verdict{Kind: Goto, Chain: chain} }

func (v Verdict) Text(Family) string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	}
	return "goto " + v.Chain
}

// verdictKinds maps our verdicts to the kernel's.
var verdictKinds = map[VerdictKind]expr.VerdictKind{
	Accept: expr.VerdictAccept, Drop: expr.VerdictDrop, Return: expr.VerdictReturn,
	Jump: expr.VerdictJump, Goto: expr.VerdictGoto,
}

func (v Verdict) Expr() *expr.Verdict {
	return &expr.Verdict{Kind: verdictKinds[v.Kind], Chain: v.Chain}
}

func (v Verdict) Exprs(Family) []expr.Any { return []expr.Any{v.Expr()} }

// ProtoName is nft's name of an L4 protocol number (tcp, udp, sctp).
func ProtoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

func le32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
