package nftlib

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

var hookNames = map[uint32]string{
	unix.NF_INET_PRE_ROUTING: "prerouting", unix.NF_INET_LOCAL_IN: "input", unix.NF_INET_FORWARD: "forward",
	unix.NF_INET_LOCAL_OUT: "output", unix.NF_INET_POST_ROUTING: "postrouting",
}

// ReadTable reads one table as the kernel holds it back into a Table:
// chains with their rules decoded into terms, maps with their elements.
// Every chain and element goes into the table's fixed lists (the kernel
// knows no fragments). The maps must be template's (which gives their key
// fields) or the sticky set; a set or a rule's expressions that are not
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
		if s == template.Sticky {
			t.Sticky, t.StickyComment = s, template.StickyComment
			continue
		}
		tm := template.Map(s)
		if tm == nil {
			return nil, fmt.Errorf("%s %s: set %s is not one of ours", f, name, s)
		}
		m := &Map{Name: s, Key: tm.Key, Comment: tm.Comment, Plain: tm.Plain, Interval: tm.Interval}
		var derr error
		err := k.dumpElements(f, name, s, func(e kElement) {
			el, err := decodeElement(f, m, e)
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

func decodeElement(f Family, m *Map, e kElement) (Element, error) {
	k, err := m.decodeKey(f, e.key, e.end)
	el := Element{Key: k, Comment: udataComment(e.udata)}
	if err != nil {
		return el, err
	}
	if m.Plain {
		return el, nil
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
	ok := forAttrs(b, func(el nlAttr) {
		var name string
		decoded := false
		forAttrs(el.data, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_EXPR_NAME:
				name = a.str()
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

// ReadElements reads the elements the kernel holds in those of t's maps
// whose type and comment are t's, by map name; kt is what ReadFamily
// read of t's table. A map of another type, or missing, has none.
func (k *Kernel) ReadElements(t *Table, kt *KernelTable) (map[string][]Element, error) {
	out := map[string][]Element{}
	if !kt.Exists {
		return out, nil
	}
	for _, m := range t.Maps {
		if mapMismatch(t.Family, kt.Sets[m.Name], m) != "" {
			continue
		}
		var elems []Element
		var bad error
		err := k.dumpElements(t.Family, t.Name, m.Name, func(e kElement) {
			el, err := decodeElement(t.Family, m, e)
			if err != nil {
				bad = errors.Join(bad, err)
				return
			}
			elems = append(elems, el)
		})
		if errors.Is(err, syscall.ENOENT) {
			continue // deleted since kt was read: none
		}
		if err != nil {
			return nil, err
		}
		if bad != nil {
			return nil, fmt.Errorf("%s %s set %s: %w", t.Family, t.Name, m.Name, bad)
		}
		out[m.Name] = elems
	}
	return out, nil
}
