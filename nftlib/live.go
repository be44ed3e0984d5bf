package nftlib

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableComments lists the tables of family f that the kernel holds, each
// with its comment.
func (k *Kernel) TableComments(f Family) (map[string]string, error) {
	comments := map[string]string{}
	err := k.dump(unix.NFT_MSG_GETTABLE, f, nil, func(p []byte) error {
		var name string
		var udata []byte
		ForAttrs(p, func(a Attr) {
			switch a.typ {
			case unix.NFTA_TABLE_NAME:
				name = a.Str()
			case nftaTableUserdata:
				udata = clone(a.data)
			}
		})
		comments[name] = udataComment(udata)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", f, err)
	}
	return comments, nil
}

var hookNames = map[uint32]string{
	unix.NF_INET_PRE_ROUTING: "prerouting", unix.NF_INET_LOCAL_IN: "input", unix.NF_INET_FORWARD: "forward",
	unix.NF_INET_LOCAL_OUT: "output", unix.NF_INET_POST_ROUTING: "postrouting",
}

// ReadTable reads one table as the kernel holds it back into a Table:
// chains with their rules decoded into terms, maps with their elements.
// Every chain and element goes into the table's fixed lists (the kernel
// knows no fragments). The maps must be template's (which gives their key
// fields) or the affinity set; a set or a rule's expressions that are not
// ones this package writes are an error naming them.
func (k *Kernel) ReadTable(f Family, name string, template *Table) (*Table, error) {
	t := &Table{Family: f, Name: name, Fragments: map[string]*Fragment{}}
	var order []string
	chains := map[string]*Chain{}
	err := k.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(p []byte) error {
		table, cname, kc := parseChain(p)
		if table != name {
			return nil
		}
		c := &Chain{Name: cname, Comment: udataComment(kc.udata)}
		if kc.Base {
			c.Hook = &Hook{Type: kc.typ, Hook: hookNames[kc.hook], Priority: kc.priority}
		}
		order = append(order, cname)
		chains[cname] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing chains of %s %s: %w", f, name, err)
	}
	for _, cname := range order {
		c := chains[cname]
		var derr error
		err := k.dumpChainRules(f, name, cname, func(chain string, exprs, udata []byte) {
			if chain != cname || derr != nil {
				return
			}
			terms, err := decodeRule(f, exprs)
			if err != nil {
				derr = fmt.Errorf("%s %s chain %s, rule %d: %w", f, name, cname, len(c.Rules)+1, err)
				return
			}
			c.Rules = append(c.Rules, Rule{Terms: terms, Comment: udataComment(udata)})
		})
		if err != nil {
			return nil, err
		}
		if derr != nil {
			return nil, derr
		}
		t.Chains = append(t.Chains, c)
	}
	// Maps: the template's, with the key fields it gives them.
	sets, err := k.setNames(f, name)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if s == SetAffinity {
			t.Affinity = true
			continue
		}
		tm := template.Map(s)
		if tm == nil {
			return nil, fmt.Errorf("%s %s: set %s is not one of ours", f, name, s)
		}
		m := &Map{Name: s, Key: tm.Key, Comment: tm.Comment}
		var derr error
		err := k.dumpElements(f, name, s, func(e kElement) {
			el, err := decodeElement(f, m.Key, e)
			if err != nil && derr == nil {
				derr = fmt.Errorf("%s %s map %s: %w", f, name, s, err)
			}
			m.Elements = append(m.Elements, el)
		})
		if err != nil {
			return nil, err
		}
		if derr != nil {
			return nil, derr
		}
		t.Maps = append(t.Maps, m)
	}
	return t, nil
}

// udataComment reads the comment TLV (type 0) of a userdata attribute.
func udataComment(u []byte) string {
	for len(u) >= 2 {
		typ, l := u[0], int(u[1])
		if 2+l > len(u) {
			return ""
		}
		if typ == 0 {
			return strings.TrimRight(string(u[2:2+l]), "\x00")
		}
		u = u[2+l:]
	}
	return ""
}

func decodeElement(f Family, key []Field, e kElement) (Element, error) {
	el := Element{Comment: udataComment(e.udata)}
	b := e.key
	for _, fl := range key {
		n := int((fl.Size(f) + 3) &^ 3)
		if len(b) < n {
			return el, fmt.Errorf("element key of %d bytes is too short", len(e.key))
		}
		switch fl {
		case FieldSaddr, FieldDaddr:
			a, _ := netip.AddrFromSlice(b[:f.addrLen()])
			el.Key.Addr = a
		case FieldL4Proto:
			el.Key.Proto = b[0]
		case FieldDport:
			el.Key.Port = binary.BigEndian.Uint16(b)
		}
		b = b[n:]
	}
	switch e.verdict {
	case unix.NFT_JUMP:
		el.Verdict = JumpTo(e.chain)
	case unix.NFT_GOTO:
		el.Verdict = GotoChain(e.chain)
	case unix.NFT_RETURN:
		el.Verdict = Verdict{Kind: Return}
	case 0: // NF_DROP
		el.Verdict = Verdict{Kind: Drop}
	case 1: // NF_ACCEPT
		el.Verdict = Verdict{Kind: Accept}
	default:
		return el, fmt.Errorf("element verdict %d", e.verdict)
	}
	return el, nil
}

// parseExprs reads an NFTA_RULE_EXPRESSIONS payload into expressions.
func parseExprs(f Family, b []byte) ([]expr.Any, error) {
	var out []expr.Any
	var err error
	ok := ForAttrs(b, func(el Attr) {
		var name string
		decoded := false
		ForAttrs(el.data, func(a Attr) {
			switch a.typ {
			case unix.NFTA_EXPR_NAME:
				name = a.Str()
			case unix.NFTA_EXPR_DATA:
				decoded = true
				if err != nil {
					return
				}
				e := exprNamed(name)
				if e == nil {
					err = fmt.Errorf("expression %q is not one we write", name)
					return
				}
				if err = expr.Unmarshal(byte(f), a.data, e); err != nil {
					err = fmt.Errorf("decoding %s: %w", name, err)
					return
				}
				// A verdict is an immediate into the verdict register.
				if imm, isImm := e.(*expr.Immediate); isImm && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
					e = &expr.Verdict{}
					if err = expr.Unmarshal(byte(f), a.data, e); err != nil {
						return
					}
				}
				out = append(out, e)
			}
		})
		if !decoded && err == nil {
			// An expression without attributes (a masq without flags).
			if e := exprNamed(name); e != nil {
				out = append(out, e)
			} else {
				err = fmt.Errorf("expression %q is not one we write", name)
			}
		}
	})
	if !ok {
		return nil, fmt.Errorf("malformed expressions")
	}
	return out, err
}

func exprNamed(name string) expr.Any {
	switch name {
	case "payload":
		return &expr.Payload{}
	case "cmp":
		return &expr.Cmp{}
	case "meta":
		return &expr.Meta{}
	case "bitwise":
		return &expr.Bitwise{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "nat":
		return &expr.NAT{}
	case "masq":
		return &expr.Masq{}
	case "reject":
		return &expr.Reject{}
	case "fib":
		return &expr.Fib{}
	case "ct":
		return &expr.Ct{}
	case "numgen":
		return &expr.Numgen{}
	case "dynset":
		return &expr.Dynset{}
	case "counter":
		return &expr.Counter{}
	}
	return nil
}

// decodeRule turns a rule's expressions back into the terms that emit them.
func decodeRule(f Family, b []byte) ([]Term, error) {
	ex, err := parseExprs(f, b)
	if err != nil {
		return nil, err
	}
	var terms []Term
	var loads []Field
	var mark, iif bool
	var bitwise *expr.Bitwise
	var fib *expr.Fib
	var ct *expr.Ct
	var ng *expr.Numgen
	var imms []*expr.Immediate
	reset := func() { loads, mark, iif, bitwise, fib, ct, ng = nil, false, false, nil, nil, nil, nil }
	for _, e := range ex {
		switch e := e.(type) {
		case *expr.Payload:
			fl, ok := payloadField(f, e)
			if !ok {
				return nil, fmt.Errorf("payload load at base %d offset %d length %d is not one we write", e.Base, e.Offset, e.Len)
			}
			loads = append(loads, fl)
		case *expr.Meta:
			switch {
			case e.SourceRegister && e.Key == expr.MetaKeyMARK && mark && bitwise != nil:
				mask, xor := binary.NativeEndian.Uint32(bitwise.Mask), binary.NativeEndian.Uint32(bitwise.Xor)
				terms = append(terms, MarkSet{Bit: xor, Toggle: mask == 0xffffffff})
				reset()
			case e.Key == expr.MetaKeyL4PROTO:
				loads = append(loads, FieldL4Proto)
			case e.Key == expr.MetaKeyMARK:
				mark = true
			case e.Key == expr.MetaKeyIIFNAME:
				iif = true
			default:
				return nil, fmt.Errorf("meta key %d is not one we write", e.Key)
			}
		case *expr.Bitwise:
			bitwise = e
		case *expr.Fib:
			fib = e
		case *expr.Ct:
			ct = e
		case *expr.Numgen:
			ng = e
		case *expr.Cmp:
			t, err := cmpTerm(f, e, loads, mark, iif, bitwise, fib, ct, ng)
			if err != nil {
				return nil, err
			}
			terms = append(terms, t)
			reset()
		case *expr.Lookup:
			switch {
			case ng != nil && e.SetName == SetAffinity:
				terms = append(terms, AffinityMatch{ID: ng.Offset})
			case e.IsDestRegSet:
				terms = append(terms, Vmap(e.SetName, loads...))
			case len(loads) == 1:
				terms = append(terms, SetMatch{Field: loads[0], Set: e.SetName})
			default:
				return nil, fmt.Errorf("lookup in %s with %d keys", e.SetName, len(loads))
			}
			reset()
		case *expr.Dynset:
			if ng == nil || e.SetName != SetAffinity {
				return nil, fmt.Errorf("dynset on %s is not one we write", e.SetName)
			}
			terms = append(terms, AffinityUpdate{ID: ng.Offset, Timeout: e.Timeout})
			reset()
		case *expr.Immediate:
			imms = append(imms, e)
		case *expr.NAT:
			if e.Type != expr.NATTypeDestNAT || len(imms) != 2 || len(imms[1].Data) != 2 {
				return nil, fmt.Errorf("nat is not a dnat to an address and port")
			}
			a, ok := netip.AddrFromSlice(imms[0].Data)
			if !ok {
				return nil, fmt.Errorf("dnat address of %d bytes", len(imms[0].Data))
			}
			terms = append(terms, DNAT{Addr: a, Port: binary.BigEndian.Uint16(imms[1].Data)})
			imms = nil
		case *expr.Masq:
			terms = append(terms, Masquerade{})
		case *expr.Reject:
			terms = append(terms, Reject{})
		case *expr.Verdict:
			v, err := decodeVerdict(e)
			if err != nil {
				return nil, err
			}
			terms = append(terms, v)
		case *expr.Counter:
		default:
			return nil, fmt.Errorf("expression %T is not one we write", e)
		}
	}
	if len(loads) > 0 || mark || iif || bitwise != nil || fib != nil || ct != nil || ng != nil || len(imms) > 0 {
		return nil, fmt.Errorf("expressions left without a comparison")
	}
	return terms, nil
}

func payloadField(f Family, p *expr.Payload) (Field, bool) {
	switch {
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

// cmpTerm is the match a comparison ends, from what was loaded before it.
func cmpTerm(f Family, c *expr.Cmp, loads []Field, mark, iif bool, bw *expr.Bitwise, fib *expr.Fib, ct *expr.Ct, ng *expr.Numgen) (Term, error) {
	negate := c.Op == expr.CmpOpNeq
	if c.Op != expr.CmpOpEq && !negate {
		return nil, fmt.Errorf("comparison operator %d is not one we write", c.Op)
	}
	u32 := func(b []byte) uint32 {
		if len(b) < 4 {
			return 0
		}
		return binary.NativeEndian.Uint32(b)
	}
	switch {
	case fib != nil:
		return FibLocal{Saddr: fib.FlagSADDR}, nil
	case ct != nil && bw != nil:
		return ctTerm(ct, bw, c, u32)
	case mark && bw != nil:
		if u32(c.Data) == 0 {
			return MarkZero{Bit: u32(bw.Mask)}, nil
		}
		return MarkIsSet{Bit: u32(bw.Mask)}, nil
	case iif:
		name := strings.TrimRight(string(c.Data), "\x00")
		return IfName{Name: name, Prefix: len(c.Data) < unix.IFNAMSIZ, Negate: negate}, nil
	case ng != nil:
		return NumgenZero{Mod: ng.Modulus}, nil
	case len(loads) != 1:
		return nil, fmt.Errorf("comparison after %d loads", len(loads))
	}
	switch loads[0] {
	case FieldL4Proto:
		if len(c.Data) != 1 {
			return nil, fmt.Errorf("l4proto comparison of %d bytes", len(c.Data))
		}
		return ProtoMatch{Proto: c.Data[0]}, nil
	case FieldDport:
		if len(c.Data) != 2 {
			return nil, fmt.Errorf("port comparison of %d bytes", len(c.Data))
		}
		return PortMatch{Port: binary.BigEndian.Uint16(c.Data)}, nil
	}
	full := make([]byte, f.addrLen())
	copy(full, c.Data)
	a, _ := netip.AddrFromSlice(full)
	n := 8 * len(c.Data)
	if bw != nil {
		n = 0
		for _, m := range bw.Mask {
			n += bits.OnesCount8(m)
		}
	}
	return AddrMatch{Field: loads[0], Negate: negate, Prefix: netip.PrefixFrom(a, n)}, nil
}

func decodeVerdict(v *expr.Verdict) (Verdict, error) {
	switch v.Kind {
	case expr.VerdictAccept:
		return Verdict{Kind: Accept}, nil
	case expr.VerdictDrop:
		return Verdict{Kind: Drop}, nil
	case expr.VerdictReturn:
		return Verdict{Kind: Return}, nil
	case expr.VerdictJump:
		return JumpTo(v.Chain), nil
	case expr.VerdictGoto:
		return GotoChain(v.Chain), nil
	}
	return Verdict{}, fmt.Errorf("verdict %d is not one we write", v.Kind)
}
