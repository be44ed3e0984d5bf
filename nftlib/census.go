package nftlib

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Census is what the nftables tables of a network namespace hold, counted:
// anyone's tables, ours or another proxy's, read over netlink in time
// linear in their size (`nft -j list ruleset` is not, past 10^5 chains).
type Census struct {
	Tables, Chains, Rules, Sets, Elements int
}

// Count counts the chains, rules, sets and set elements of every ip, ip6
// and inet table whose name keep accepts. value, when not nil, is called
// with every constant the rules compare with or load (cmp, immediate and
// range data) and every element's key and data: the values are only valid
// during the call.
func (k *Kernel) Count(keep func(table string) bool, value func(v []byte)) (Census, error) {
	var c Census
	for _, f := range []Family{IPv4, IPv6, unix.NFPROTO_INET} {
		var tables []string
		err := k.dump(unix.NFT_MSG_GETTABLE, f, nil, func(p []byte) error {
			forAttrs(p, func(a nlAttr) {
				if a.typ == unix.NFTA_TABLE_NAME && keep(a.str()) {
					tables = append(tables, a.str())
				}
			})
			return nil
		})
		if err != nil {
			return c, fmt.Errorf("listing %s tables: %w", f, err)
		}
		if len(tables) == 0 {
			continue
		}
		c.Tables += len(tables)
		chains := map[string][]string{}
		err = k.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(p []byte) error {
			table, name, _ := parseChain(p)
			if keep(table) {
				chains[table] = append(chains[table], name)
			}
			return nil
		})
		if err != nil {
			return c, fmt.Errorf("listing %s chains: %w", f, err)
		}
		for _, table := range tables {
			if err := k.countTable(f, table, chains[table], &c, value); err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

// countTable adds a table's chains, rules, sets and elements to c.
func (k *Kernel) countTable(f Family, table string, chains []string, c *Census, value func([]byte)) error {
	c.Chains += len(chains)
	// One dump per chain: a table-wide rule dump is quadratic (see
	// dumpChainRules).
	for _, chain := range chains {
		err := k.dumpChainRules(f, table, chain, func(_ string, exprs, _ []byte) {
			c.Rules++
			if value != nil {
				ruleValues(exprs, value)
			}
		})
		if err != nil {
			return err
		}
	}
	sets, err := k.setNames(f, table)
	if err != nil {
		return err
	}
	c.Sets += len(sets)
	for _, set := range sets {
		if err := k.countElements(f, table, set, c, value); err != nil {
			return err
		}
	}
	return nil
}

// setNames lists the names of a table's sets and maps, anonymous ones
// included.
func (k *Kernel) setNames(f Family, table string) ([]string, error) {
	var sets []string
	err := k.dump(unix.NFT_MSG_GETSET, f, func(m *batch) { m.str(unix.NFTA_SET_TABLE, table) }, func(p []byte) error {
		forAttrs(p, func(a nlAttr) {
			if a.typ == unix.NFTA_SET_NAME {
				sets = append(sets, a.str())
			}
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", f, table, err)
	}
	return sets, nil
}

// countElements counts a set's elements and passes their keys and data on.
func (k *Kernel) countElements(f Family, table, set string, c *Census, value func([]byte)) error {
	return k.dumpRawElements(f, table, set, func(el []byte) {
		c.Elements++
		if value == nil {
			return
		}
		forAttrs(el, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_SET_ELEM_KEY, nftaSetElemKeyEnd, unix.NFTA_SET_ELEM_DATA:
				dataValue(a.data, value)
			}
		})
	})
}

// ruleValues passes on the constants of a rule's expressions.
func ruleValues(exprs []byte, value func([]byte)) {
	forExprs(exprs, func(name string, data []byte) {
		forAttrs(data, func(a nlAttr) {
			switch {
			case name == "immediate" && a.typ == unix.NFTA_IMMEDIATE_DATA,
				name == "cmp" && a.typ == unix.NFTA_CMP_DATA,
				name == "range" && (a.typ == unix.NFTA_RANGE_FROM_DATA || a.typ == unix.NFTA_RANGE_TO_DATA):
				dataValue(a.data, value)
			}
		})
	})
}

// dataValue passes on the NFTA_DATA_VALUE of an nft_data nest.
func dataValue(nest []byte, value func([]byte)) {
	forAttrs(nest, func(v nlAttr) {
		if v.typ == unix.NFTA_DATA_VALUE {
			value(v.data)
		}
	})
}
