package nftlib

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// expr appends one expression (an NFTA_LIST_ELEM) to the message being
// written. The expressions our terms use most are encoded here directly,
// byte for byte as google/nftables does (a test holds the two equal):
// a full sync encodes hundreds of thousands of them, and the generic
// encoder's allocations cost more than the kernel's work. Anything else
// goes through expr.Marshal.
func (b *batch) expr(f Family, e expr.Any) {
	switch e := e.(type) {
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad || e.CsumType != 0 {
			b.marshalledElem(f, e)
			return
		}
		b.payloadLoad(e.DestRegister, e.Base, e.Offset, e.Len)
	case *expr.Cmp:
		b.cmp(e.Register, e.Op, e.Data)
	case *expr.Verdict:
		b.verdict(e.Kind, e.Chain)
	case *expr.Immediate:
		b.immediate(e.Register, e.Data)
	case *expr.Numgen:
		b.numgen(e.Register, e.Modulus, e.Type, e.Offset)
	case *expr.Meta:
		// Every service port's protocol match and every mark rule: as
		// the library, without its intermediate buffers.
		b.meta(e.Key, e.Register, e.SourceRegister)
	case *expr.NAT:
		// Every endpoint's DNAT rule.
		b.nat(e)
	default:
		b.marshalledElem(f, e)
	}
}

func (b *batch) marshalledElem(f Family, e expr.Any) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.marshalled(f, e)
	b.unnest()
}

// The expressions, each an NFTA_LIST_ELEM. The terms that fill most of a
// full sync call them directly (see directTerm) with values on the stack.

func (b *batch) payloadLoad(reg uint32, base expr.PayloadBase, off, n uint32) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "payload")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_PAYLOAD_DREG, reg)
	b.u32(unix.NFTA_PAYLOAD_BASE, uint32(base))
	b.u32(unix.NFTA_PAYLOAD_OFFSET, off)
	b.u32(unix.NFTA_PAYLOAD_LEN, n)
	b.unnest()
	b.unnest()
}

func (b *batch) cmp(reg uint32, op expr.CmpOp, data []byte) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "cmp")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_CMP_SREG, reg)
	b.u32(unix.NFTA_CMP_OP, uint32(op))
	b.nest(unix.NFTA_CMP_DATA)
	b.attr(unix.NFTA_DATA_VALUE, data)
	b.unnest()
	b.unnest()
	b.unnest()
}

func (b *batch) verdict(kind expr.VerdictKind, chain string) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "immediate")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	b.nest(unix.NFTA_IMMEDIATE_DATA)
	b.nest(unix.NFTA_DATA_VERDICT)
	b.u32(unix.NFTA_VERDICT_CODE, uint32(kind))
	if chain != "" {
		b.str(unix.NFTA_VERDICT_CHAIN, chain)
	}
	b.unnest()
	b.unnest()
	b.unnest()
	b.unnest()
}

func (b *batch) immediate(reg uint32, data []byte) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "immediate")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_IMMEDIATE_DREG, reg)
	b.nest(unix.NFTA_IMMEDIATE_DATA)
	b.attr(unix.NFTA_DATA_VALUE, data)
	b.unnest()
	b.unnest()
	b.unnest()
}

func (b *batch) numgen(reg, mod, typ, off uint32) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "numgen")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_NG_DREG, reg)
	b.u32(unix.NFTA_NG_MODULUS, mod)
	b.u32(unix.NFTA_NG_TYPE, typ)
	b.u32(unix.NFTA_NG_OFFSET, off)
	b.unnest()
	b.unnest()
}

func (b *batch) meta(key expr.MetaKey, reg uint32, sreg bool) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "meta")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_META_KEY, uint32(key))
	if sreg {
		b.u32(unix.NFTA_META_SREG, reg)
	} else {
		b.u32(unix.NFTA_META_DREG, reg)
	}
	b.unnest()
	b.unnest()
}

func (b *batch) nat(e *expr.NAT) {
	b.nest(unix.NFTA_LIST_ELEM)
	b.str(unix.NFTA_EXPR_NAME, "nat")
	b.nest(unix.NFTA_EXPR_DATA)
	b.u32(unix.NFTA_NAT_TYPE, uint32(e.Type))
	b.u32(unix.NFTA_NAT_FAMILY, e.Family)
	if e.RegAddrMin != 0 {
		b.u32(unix.NFTA_NAT_REG_ADDR_MIN, e.RegAddrMin)
		if e.RegAddrMax != 0 {
			b.u32(unix.NFTA_NAT_REG_ADDR_MAX, e.RegAddrMax)
		}
	}
	if e.RegProtoMin != 0 {
		b.u32(unix.NFTA_NAT_REG_PROTO_MIN, e.RegProtoMin)
		if e.RegProtoMax != 0 {
			b.u32(unix.NFTA_NAT_REG_PROTO_MAX, e.RegProtoMax)
		}
	}
	var flags uint32
	for _, fl := range []struct {
		set  bool
		flag uint32
	}{
		{e.Random, expr.NF_NAT_RANGE_PROTO_RANDOM}, {e.FullyRandom, expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY},
		{e.Persistent, expr.NF_NAT_RANGE_PERSISTENT}, {e.Prefix, expr.NF_NAT_RANGE_PREFIX},
		{e.Specified, expr.NF_NAT_RANGE_PROTO_SPECIFIED},
	} {
		if fl.set {
			flags |= fl.flag
		}
	}
	if flags != 0 {
		b.u32(unix.NFTA_NAT_FLAGS, flags)
	}
	b.unnest()
	b.unnest()
}

// directTerm is a term that writes its expressions into a batch itself,
// without building them first: the terms of every endpoint's rules, which
// are most of a full sync. direct must append exactly what encoding
// exprs(f) appends (TestEveryTermKind), or report false, having appended
// nothing, to have exprs used. Each sits in
// its term's file.
type directTerm interface {
	direct(b *batch, f Family) bool
}

// marshalled appends the expression's name and data as google/nftables
// encodes them.
func (b *batch) marshalled(f Family, e expr.Any) {
	data, err := expr.Marshal(byte(f), e)
	if err != nil && b.err == nil {
		b.err = err
	}
	b.Buf = append(b.Buf, data...)
	b.pad()
}
