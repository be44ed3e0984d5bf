package leftover

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// iptChains is what of kube-proxy one iptables-nft table holds: its
// chains, and the rules of other chains that jump or go to them.
type iptChains struct {
	table  nftlib.TableRef
	chains []string
	jumps  []nftlib.ListedRule
}

// nftFound is what of upstream kube-proxy nftables holds.
type nftFound struct {
	tables   []nftlib.TableRef // nftables mode's: ip kube-proxy, ip6 kube-proxy
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
				if !slices.Contains(from, r.Chain) {
					from = append(from, r.Chain)
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
func planIPTables(t nftlib.TableRef, chains []nftlib.ListedChain, rules []nftlib.ListedRule) iptChains {
	out := iptChains{table: t}
	kube := map[string]bool{}
	for _, c := range chains {
		if !c.Base && isKubeProxyChain(t.Name, c.Name) {
			kube[c.Name] = true
			out.chains = append(out.chains, c.Name)
		}
	}
	for _, r := range rules {
		if kube[r.Chain] {
			continue
		}
		if slices.ContainsFunc(r.Targets, func(c string) bool { return kube[c] }) {
			out.jumps = append(out.jumps, r)
		}
	}
	slices.Sort(out.chains)
	return out
}

// scanNFTables reads what of upstream kube-proxy nftables holds: its
// nftables-mode tables, and its chains in iptables-nft's tables.
func scanNFTables(k *nftlib.Kernel) (*nftFound, error) {
	tables, err := k.ListTables()
	if err != nil {
		return nil, err
	}
	f := &nftFound{}
	for _, t := range tables {
		switch {
		case isNFTablesTable(t):
			f.tables = append(f.tables, t)
		case isIPTablesTable(t):
			chains, err := k.ListChains(t)
			if err != nil {
				return nil, err
			}
			if !slices.ContainsFunc(chains, func(ch nftlib.ListedChain) bool { return !ch.Base && isKubeProxyChain(t.Name, ch.Name) }) {
				continue
			}
			rules, err := k.ListRules(t)
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
func anyNFTables(k *nftlib.Kernel) (bool, error) {
	tables, err := k.ListTables()
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if isNFTablesTable(t) {
			return true, nil
		}
		if !isIPTablesTable(t) {
			continue
		}
		for _, name := range fixedChains[t.Name] {
			ok, err := k.HasChain(t, name)
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

// deleter writes deletions: a transaction (nftlib.KernelTx), or their nft
// text in tests.
type deleter interface {
	DelTable(f nftlib.Family, name string)
	DelRule(f nftlib.Family, table, chain string, handle uint64)
	FlushChain(f nftlib.Family, table, chain string)
	DelChain(f nftlib.Family, table, name string)
}

// writeRemoval writes the deletion of what f names: kube-proxy's tables,
// the jumps to its chains, then its chains (flushed first, so that the
// chains' own jumps to each other go before the chains do).
func writeRemoval(d deleter, f *nftFound) {
	for _, t := range f.tables {
		d.DelTable(t.Family, t.Name)
	}
	for _, p := range f.iptables {
		for _, r := range p.jumps {
			d.DelRule(p.table.Family, p.table.Name, r.Chain, r.Handle)
		}
	}
	for _, p := range f.iptables {
		for _, ch := range p.chains {
			d.FlushChain(p.table.Family, p.table.Name, ch)
		}
	}
	for _, p := range f.iptables {
		for _, ch := range p.chains {
			d.DelChain(p.table.Family, p.table.Name, ch)
		}
	}
}

// removeNFTables deletes what f names in one transaction.
func removeNFTables(k *nftlib.Kernel, f *nftFound) error {
	if f.empty() {
		return nil
	}
	b := k.NewTx()
	writeRemoval(b, f)
	err := k.CommitTx(b)
	return err
}

// cleanNFTables finds and removes upstream kube-proxy's objects in
// nftables.
func cleanNFTables(k *nftlib.Kernel) (*nftFound, error) {
	return cleanNFTablesWith(k, removeNFTables)
}

// cleanNFTablesWith is cleanNFTables with the removal transaction done by
// remove. Another process changing the objects meanwhile (an old
// kube-proxy still syncing) can make the transaction fail as a whole: then
// it reads again and retries, a few times. When the kernel's answers were
// lost, the state read back says whether the transaction was applied:
// nothing left is a success, never reported as a failure.
func cleanNFTablesWith(k *nftlib.Kernel, remove func(*nftlib.Kernel, *nftFound) error) (*nftFound, error) {
	var err error
	var unsure *nftFound // removed, if nothing is left
	for attempt := 0; ; attempt++ {
		f, scanErr := scanNFTables(k)
		switch {
		case scanErr != nil:
			return nil, scanErr
		case f.empty():
			return unsure, nil
		case attempt == 4:
			return nil, fmt.Errorf("removing upstream kube-proxy's nftables objects: %w", err)
		}
		switch err = remove(k, f); {
		case err == nil:
			return f, nil
		case errors.Is(err, nftlib.ErrAnswersLost):
			unsure = f
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY):
			unsure = nil
		default:
			return nil, fmt.Errorf("removing upstream kube-proxy's nftables objects: %w", err)
		}
	}
}
