package nftlib

import (
	"encoding/binary"
	"slices"

	"golang.org/x/sys/unix"
)

// The kernel does not dump a rule's expressions byte for byte as we encode
// them (TestKernelRuleDumpCanonical pins what differs, on every golden
// state): attributes come in another order, nested attributes lack
// NLA_F_NESTED, registers are numbered in 128-bit units where they can be,
// defaults are added (lookup and bitwise flags, NAT's max registers and
// MAP_IPS flag) and set ids are left out. canonExprs maps both sides to one
// form that keeps every value that changes what a rule does.

// regAttrs are the attributes of each expression that name a register.
var regAttrs = map[string][]uint16{
	"payload":   {unix.NFTA_PAYLOAD_DREG, unix.NFTA_PAYLOAD_SREG},
	"meta":      {unix.NFTA_META_DREG, unix.NFTA_META_SREG},
	"cmp":       {unix.NFTA_CMP_SREG},
	"lookup":    {unix.NFTA_LOOKUP_SREG, unix.NFTA_LOOKUP_DREG},
	"immediate": {unix.NFTA_IMMEDIATE_DREG},
	"bitwise":   {unix.NFTA_BITWISE_SREG, unix.NFTA_BITWISE_DREG},
	"nat":       {unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX, unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX},
	"numgen":    {unix.NFTA_NG_DREG},
	"fib":       {unix.NFTA_FIB_DREG},
	"ct":        {unix.NFTA_CT_DREG, unix.NFTA_CT_SREG},
	"dynset":    {unix.NFTA_DYNSET_SREG_KEY, unix.NFTA_DYNSET_SREG_DATA},
	"masq":      {unix.NFTA_MASQ_REG_PROTO_MIN, unix.NFTA_MASQ_REG_PROTO_MAX},
}

// dataAttrs hold nested nft_data (a value or a verdict).
var dataAttrs = map[string][]uint16{
	"cmp":       {unix.NFTA_CMP_DATA},
	"immediate": {unix.NFTA_IMMEDIATE_DATA},
	"bitwise":   {unix.NFTA_BITWISE_MASK, unix.NFTA_BITWISE_XOR},
}

const (
	nftaLookupSetID = unix.NFTA_LOOKUP_SET_ID
	nftaLookupFlags = 5 // NFTA_LOOKUP_FLAGS
	nftaBitwiseOp   = 6 // NFTA_BITWISE_OP
	nfNATMapIPs     = 1 // NF_NAT_RANGE_MAP_IPS
)

// canonReg numbers a register in 32-bit units (NFT_REG32_00 = NFT_REG_1).
func canonReg(r uint32) uint32 {
	if r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4 {
		return unix.NFT_REG32_00 + (r-unix.NFT_REG_1)*4
	}
	return r
}

// canonExprs appends the canonical form of an NFTA_RULE_EXPRESSIONS payload
// to dst; ok is false when it is not well formed.
func canonExprs(dst, exprs []byte) (out []byte, ok bool) {
	ok = forExprs(exprs, func(name string, data []byte) {
		dst = append(dst, name...)
		dst = append(dst, 0)
		dst = canonExprData(dst, name, data)
	})
	return dst, ok
}

// forExprs calls fn with the name and NFTA_EXPR_DATA of each expression of
// an NFTA_RULE_EXPRESSIONS payload and reports whether it was well formed.
func forExprs(exprs []byte, fn func(name string, data []byte)) bool {
	return forAttrs(exprs, func(el nlAttr) {
		var name string
		var data []byte
		forAttrs(el.data, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_EXPR_NAME:
				name = a.str()
			case unix.NFTA_EXPR_DATA:
				data = a.data
			}
		})
		fn(name, data)
	})
}

type canonAttr struct {
	typ uint16
	val []byte
	u32 uint32 // a replaced 32-bit value, when val is nil
}

func canonExprData(dst []byte, name string, data []byte) []byte {
	var buf [16]canonAttr
	attrs := buf[:0]
	forAttrs(data, func(a nlAttr) {
		c := canonAttr{typ: a.typ, val: a.data}
		switch {
		case slices.Contains(regAttrs[name], a.typ):
			c.val, c.u32 = nil, canonReg(a.u32())
		case slices.Contains(dataAttrs[name], a.typ):
			c.val = canonData(nil, a.data)
		}
		attrs = append(attrs, c)
	})
	attrs = normalizeDefaults(name, attrs)
	slices.SortStableFunc(attrs, func(a, b canonAttr) int { return int(a.typ) - int(b.typ) })
	for _, a := range attrs {
		dst = binary.BigEndian.AppendUint16(dst, a.typ)
		if a.val == nil {
			dst = binary.BigEndian.AppendUint16(dst, 4)
			dst = binary.BigEndian.AppendUint32(dst, a.u32)
			continue
		}
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(a.val)))
		dst = append(dst, a.val...)
	}
	return binary.BigEndian.AppendUint16(dst, 0xffff) // end of expression
}

// canonData rewrites a nested nft_data without the attribute flags.
func canonData(dst, b []byte) []byte {
	forAttrs(b, func(a nlAttr) {
		dst = binary.BigEndian.AppendUint16(dst, a.typ)
		if a.typ == unix.NFTA_DATA_VERDICT {
			inner := canonData(nil, a.data)
			dst = binary.BigEndian.AppendUint16(dst, uint16(len(inner)))
			dst = append(dst, inner...)
			return
		}
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(a.data)))
		dst = append(dst, a.data...)
	})
	return dst
}

// normalizeDefaults drops what one side leaves out and the other sends as
// a default, and fills in what the kernel derives.
func normalizeDefaults(name string, attrs []canonAttr) []canonAttr {
	zero := func(a canonAttr) bool {
		if a.val == nil {
			return a.u32 == 0
		}
		return len(a.val) == 4 && binary.BigEndian.Uint32(a.val) == 0
	}
	switch name {
	case "lookup":
		return slices.DeleteFunc(attrs, func(a canonAttr) bool {
			return a.typ == nftaLookupSetID || (a.typ == nftaLookupFlags && zero(a))
		})
	case "dynset":
		return slices.DeleteFunc(attrs, func(a canonAttr) bool { return a.typ == unix.NFTA_DYNSET_SET_ID })
	case "bitwise":
		return slices.DeleteFunc(attrs, func(a canonAttr) bool { return a.typ == nftaBitwiseOp && zero(a) })
	case "nat":
		return normalizeNAT(attrs)
	}
	return attrs
}

// normalizeNAT: the kernel sets the max registers to the min ones when
// absent, and the MAP_IPS flag when an address register is given.
func normalizeNAT(attrs []canonAttr) []canonAttr {
	find := func(typ uint16) int {
		return slices.IndexFunc(attrs, func(a canonAttr) bool { return a.typ == typ })
	}
	for _, p := range [][2]uint16{
		{unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX},
		{unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX},
	} {
		if i := find(p[0]); i >= 0 && find(p[1]) < 0 {
			attrs = append(attrs, canonAttr{typ: p[1], u32: attrs[i].u32})
		}
	}
	if find(unix.NFTA_NAT_REG_ADDR_MIN) >= 0 {
		flags := uint32(0)
		if i := find(unix.NFTA_NAT_FLAGS); i >= 0 {
			flags = nlAttr{data: attrs[i].val}.u32()
			attrs = slices.Delete(attrs, i, i+1)
		}
		attrs = append(attrs, canonAttr{typ: unix.NFTA_NAT_FLAGS, u32: flags | nfNATMapIPs})
	}
	return attrs
}

// ruleExprs encodes a rule's expressions as addRule sends them (the content
// of NFTA_RULE_EXPRESSIONS), reusing scratch.
func ruleExprs(scratch *batch, f Family, r Rule) []byte {
	scratch.Buf = scratch.Buf[:0]
	for _, t := range r.Terms {
		for _, e := range t.exprs(f) {
			scratch.expr(f, e)
		}
	}
	return scratch.Buf
}
