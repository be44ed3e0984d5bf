package leftover

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// iptChains is what of kube-proxy one iptables-nft table holds: its
// chains, and the rules of other chains that jump or go to them.
type iptChains struct {
	table  table
	chains []string
	jumps  []rule
}

// nftFound is what of upstream kube-proxy nftables holds.
type nftFound struct {
	tables   []table // nftables mode's: ip kube-proxy, ip6 kube-proxy
	iptables []iptChains
}

func (f *nftFound) empty() bool { return len(f.tables) == 0 && len(f.iptables) == 0 }

// describe says what f holds, one entry per table, short enough for a log
// line: "table ip kube-proxy", "ip nat: 12 chains (KUBE-SERVICES, ...),
// 2 jumps from PREROUTING, OUTPUT".
func (f *nftFound) describe() []string {
	var out []string
	for _, t := range f.tables {
		out = append(out, "table "+t.String())
	}
	for _, c := range f.iptables {
		s := fmt.Sprintf("%s: %d chains (%s)", c.table, len(c.chains), abbreviate(c.chains, 4))
		if len(c.jumps) > 0 {
			var from []string
			for _, r := range c.jumps {
				if !slices.Contains(from, r.chain) {
					from = append(from, r.chain)
				}
			}
			s += fmt.Sprintf(", %d jumps from %s", len(c.jumps), strings.Join(from, ", "))
		}
		out = append(out, s)
	}
	return out
}

// abbreviate joins the first n names and says how many more there are.
func abbreviate(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:n], ", ") + fmt.Sprintf(" and %d more", len(names)-n)
}

// planIPTables picks, in iptables-nft table t, kube-proxy's chains (never a
// base chain) and the rules of the other chains that jump or go to them:
// the rules go first, then the chains are flushed and deleted, as
// kube-proxy's own cleanup does.
func planIPTables(t table, chains []chain, rules []rule) iptChains {
	out := iptChains{table: t}
	kube := map[string]bool{}
	for _, c := range chains {
		if !c.base && isKubeProxyChain(t.name, c.name) {
			kube[c.name] = true
			out.chains = append(out.chains, c.name)
		}
	}
	for _, r := range rules {
		if kube[r.chain] {
			continue
		}
		if slices.ContainsFunc(r.targets, func(c string) bool { return kube[c] }) {
			out.jumps = append(out.jumps, r)
		}
	}
	slices.Sort(out.chains)
	return out
}

// scanNFTables reads what of upstream kube-proxy nftables holds: its
// nftables-mode tables, and its chains in iptables-nft's tables.
func (c *conn) scanNFTables() (*nftFound, error) {
	tables, err := c.tables()
	if err != nil {
		return nil, err
	}
	f := &nftFound{}
	for _, t := range tables {
		switch {
		case (t.family == familyIPv4 || t.family == familyIPv6) && t.name == NFTablesTable:
			f.tables = append(f.tables, t)
		case isIPTablesTable(t.family, t.name):
			chains, err := c.chains(t)
			if err != nil {
				return nil, err
			}
			if !slices.ContainsFunc(chains, func(ch chain) bool { return !ch.base && isKubeProxyChain(t.name, ch.name) }) {
				continue
			}
			rules, err := c.rules(t)
			if err != nil {
				return nil, err
			}
			if p := planIPTables(t, chains, rules); len(p.chains) > 0 {
				f.iptables = append(f.iptables, p)
			}
		}
	}
	return f, nil
}

// anyNFTables is a cheap look for upstream kube-proxy in nftables: its
// tables, or one of the fixed chains of iptables and ipvs modes in
// iptables-nft's tables, each looked up by name. The per-Service chains
// are never there without the fixed ones that lead to them.
func (c *conn) anyNFTables() (bool, error) {
	tables, err := c.tables()
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if (t.family == familyIPv4 || t.family == familyIPv6) && t.name == NFTablesTable {
			return true, nil
		}
		if !isIPTablesTable(t.family, t.name) {
			continue
		}
		for _, name := range fixedChains[t.name] {
			ok, err := c.hasChain(t, name)
			if err != nil {
				return false, err
			}
			if ok {
				return true, nil
			}
		}
	}
	return false, nil
}

// removeNFTables deletes what f names in one transaction: kube-proxy's
// tables, the jumps to its chains, then its chains (flushed first, so that
// the chains' own jumps to each other go before the chains do).
func (c *conn) removeNFTables(f *nftFound) error {
	var t tx
	for _, tb := range f.tables {
		t.delTable(tb)
	}
	for _, p := range f.iptables {
		for _, r := range p.jumps {
			t.delRule(p.table, r.chain, r.handle)
		}
	}
	for _, p := range f.iptables {
		for _, ch := range p.chains {
			t.flushChain(p.table, ch)
		}
	}
	for _, p := range f.iptables {
		for _, ch := range p.chains {
			t.delChain(p.table, ch)
		}
	}
	return c.commit(&t)
}

// cleanNFTables finds and removes upstream kube-proxy's objects in
// nftables.
func (c *conn) cleanNFTables() (*nftFound, error) {
	return c.cleanNFTablesWith(c.removeNFTables)
}

// cleanNFTablesWith is cleanNFTables with the removal transaction done by
// remove. Another process changing the objects meanwhile (an old
// kube-proxy still syncing) can make the transaction fail as a whole: then
// it reads again and retries, a few times. When the kernel's answers were
// lost, the state read back says whether the transaction was applied:
// nothing left is a success, never reported as a failure.
func (c *conn) cleanNFTablesWith(remove func(*nftFound) error) (*nftFound, error) {
	var err error
	var unsure *nftFound // removed, if nothing is left
	for attempt := 0; ; attempt++ {
		f, scanErr := c.scanNFTables()
		switch {
		case scanErr != nil:
			return nil, scanErr
		case f.empty():
			return unsure, nil
		case attempt == 4:
			return nil, fmt.Errorf("removing upstream kube-proxy's nftables objects: %w", err)
		}
		switch err = remove(f); {
		case err == nil:
			return f, nil
		case errors.Is(err, errAnswersLost):
			unsure = f
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY):
			unsure = nil
		default:
			return nil, fmt.Errorf("removing upstream kube-proxy's nftables objects: %w", err)
		}
	}
}
