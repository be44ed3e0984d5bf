package nft

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
	b.nest(unix.NFTA_LIST_ELEM)
	switch e := e.(type) {
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad || e.CsumType != 0 {
			b.marshalled(f, e)
			break
		}
		b.str(unix.NFTA_EXPR_NAME, "payload")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_PAYLOAD_DREG, e.DestRegister)
		b.u32(unix.NFTA_PAYLOAD_BASE, uint32(e.Base))
		b.u32(unix.NFTA_PAYLOAD_OFFSET, e.Offset)
		b.u32(unix.NFTA_PAYLOAD_LEN, e.Len)
		b.unnest()
	case *expr.Cmp:
		b.str(unix.NFTA_EXPR_NAME, "cmp")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_CMP_SREG, e.Register)
		b.u32(unix.NFTA_CMP_OP, uint32(e.Op))
		b.nest(unix.NFTA_CMP_DATA)
		b.attr(unix.NFTA_DATA_VALUE, e.Data)
		b.unnest()
		b.unnest()
	case *expr.Verdict:
		b.str(unix.NFTA_EXPR_NAME, "immediate")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		b.nest(unix.NFTA_IMMEDIATE_DATA)
		b.nest(unix.NFTA_DATA_VERDICT)
		b.u32(unix.NFTA_VERDICT_CODE, uint32(e.Kind))
		if e.Chain != "" {
			b.str(unix.NFTA_VERDICT_CHAIN, e.Chain)
		}
		b.unnest()
		b.unnest()
		b.unnest()
	case *expr.Immediate:
		b.str(unix.NFTA_EXPR_NAME, "immediate")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_IMMEDIATE_DREG, e.Register)
		b.nest(unix.NFTA_IMMEDIATE_DATA)
		b.attr(unix.NFTA_DATA_VALUE, e.Data)
		b.unnest()
		b.unnest()
	case *expr.Numgen:
		b.str(unix.NFTA_EXPR_NAME, "numgen")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_NG_DREG, e.Register)
		b.u32(unix.NFTA_NG_MODULUS, e.Modulus)
		b.u32(unix.NFTA_NG_TYPE, e.Type)
		b.u32(unix.NFTA_NG_OFFSET, e.Offset)
		b.unnest()
	case *expr.Meta:
		// Every service port's protocol match and every mark rule: as
		// the library, without its intermediate buffers.
		b.str(unix.NFTA_EXPR_NAME, "meta")
		b.nest(unix.NFTA_EXPR_DATA)
		b.u32(unix.NFTA_META_KEY, uint32(e.Key))
		if e.SourceRegister {
			b.u32(unix.NFTA_META_SREG, e.Register)
		} else {
			b.u32(unix.NFTA_META_DREG, e.Register)
		}
		b.unnest()
	case *expr.NAT:
		// Every endpoint's DNAT rule.
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
	default:
		b.marshalled(f, e)
	}
	b.unnest()
}

// marshalled appends the expression's name and data as google/nftables
// encodes them.
func (b *batch) marshalled(f Family, e expr.Any) {
	data, err := expr.Marshal(byte(f), e)
	if err != nil && b.err == nil {
		b.err = err
	}
	b.buf = append(b.buf, data...)
	b.pad()
}
