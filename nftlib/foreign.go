package nftlib

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// The listing of any table, another program's included (iptables-nft's,
// upstream kube-proxy's): only the attributes that say what to delete
// (names, base chains, rule handles, jump targets) are read, so that any
// rule, whatever its expressions (xtables matches and targets too), can be
// listed.

// ListedChain is a chain as ListChains reports it; a base chain hooks
// into the stack.
type ListedChain struct {
	Name string
	Base bool
}

// ListedRule is a rule's place and the chains its verdicts jump or go to.
type ListedRule struct {
	Chain   string
	Handle  uint64
	Targets []string
}

// ListTables lists every table of the network namespace, of every family.
func (k *Kernel) ListTables() ([]TableRef, error) {
	var out []TableRef
	err := k.dumpFamilies(unix.NFT_MSG_GETTABLE, unix.NFPROTO_UNSPEC, nil, func(f Family, p []byte) error {
		forAttrs(p, func(a nlAttr) {
			if a.typ == unix.NFTA_TABLE_NAME {
				out = append(out, TableRef{f, a.str()})
			}
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	return out, nil
}

// ListChains lists the chains of table t.
func (k *Kernel) ListChains(t TableRef) ([]ListedChain, error) {
	var out []ListedChain
	attrs := func(m *batch) { m.str(unix.NFTA_CHAIN_TABLE, t.Name) }
	err := k.dumpFamilies(unix.NFT_MSG_GETCHAIN, t.Family, attrs, func(f Family, p []byte) error {
		table, name, c := parseChain(p)
		// Older kernels ignore the table in a chain dump request.
		if f == t.Family && table == t.Name {
			out = append(out, ListedChain{Name: name, Base: c.Base})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the chains of table %s: %w", t, err)
	}
	return out, nil
}

// HasChain reports whether table t has a chain of that name, with one
// request rather than a dump.
func (k *Kernel) HasChain(t TableRef, name string) (bool, error) {
	found := map[string]*kernelChain{}
	if err := k.getChains(t.Family, t.Name, []string{name}, found); err != nil {
		return false, fmt.Errorf("looking up chain %s in table %s: %w", name, t, err)
	}
	return found[name] != nil, nil
}

// ListRules lists the rules of table t, with their handles and the chains
// their verdicts jump or go to.
func (k *Kernel) ListRules(t TableRef) ([]ListedRule, error) {
	var out []ListedRule
	attrs := func(m *batch) { m.str(unix.NFTA_RULE_TABLE, t.Name) }
	err := k.dumpFamilies(unix.NFT_MSG_GETRULE, t.Family, attrs, func(f Family, p []byte) error {
		var r ListedRule
		var table string
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_RULE_TABLE:
				table = a.str()
			case unix.NFTA_RULE_CHAIN:
				r.Chain = a.str()
			case unix.NFTA_RULE_HANDLE:
				if len(a.data) == 8 {
					r.Handle = binary.BigEndian.Uint64(a.data)
				}
			case unix.NFTA_RULE_EXPRESSIONS:
				r.Targets = jumpTargets(a.data)
			}
		})
		if f == t.Family && table == t.Name {
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the rules of table %s: %w", t, err)
	}
	return out, nil
}

// jumpTargets returns the chains that the immediate verdicts (jump, goto)
// of a rule's NFTA_RULE_EXPRESSIONS payload name; other expressions, and
// malformed input, name none.
func jumpTargets(exprs []byte) []string {
	var out []string
	forExprs(exprs, func(name string, data []byte) {
		if name != "immediate" {
			return
		}
		forAttrs(data, func(a nlAttr) {
			if a.typ != unix.NFTA_IMMEDIATE_DATA {
				return
			}
			forAttrs(a.data, func(d nlAttr) {
				if d.typ != unix.NFTA_DATA_VERDICT {
					return
				}
				if target, ok := jumpTarget(d.data); ok {
					out = append(out, target)
				}
			})
		})
	})
	return out
}

// jumpTarget returns the chain of an NFTA_DATA_VERDICT that jumps or goes
// to one.
func jumpTarget(verdict []byte) (string, bool) {
	var code int32
	var target string
	forAttrs(verdict, func(v nlAttr) {
		switch v.typ {
		case unix.NFTA_VERDICT_CODE:
			if len(v.data) == 4 {
				code = int32(v.u32())
			}
		case unix.NFTA_VERDICT_CHAIN:
			target = v.str()
		}
	})
	return target, (code == unix.NFT_JUMP || code == unix.NFT_GOTO) && target != ""
}
