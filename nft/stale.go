package nft

import (
	"slices"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// staleChainAge is how long a chain stays after the transaction that
// flushed it (and removed the map elements pointing to it) before one
// deletes it: kernels before 6.2 release a chain referenced from a deleted
// verdict map element only a little after the commit, and refuse to delete
// it until then (upstream's nftables mode waits as long). Sync asks for a
// follow-up sync at that time (SyncResult.FollowUpAt), so that emptied
// chains do not stay until the next periodic sync.
const staleChainAge = time.Second

// staleChains is the clock of the chains flushed by earlier transactions:
// which are left to delete, per table, and since when.
type staleChains struct {
	pending map[tableID][]string
	since   map[tableID]map[string]time.Time
	// now is the clock (tests move it).
	now func() time.Time
}

// due says which chains of a table may be deleted at now.
func (s *staleChains) due(id tableID, now time.Time) func(chain string) bool {
	return func(chain string) bool { return now.Sub(s.since[id][chain]) >= staleChainAge }
}

// deleteDueChains adds to x, a transaction from have to want at the
// fragments keys names, the deletion of the pending chains (flushed by
// earlier transactions) that due says may go, unless x wants them again:
// a fixed chain, or one of a fragment that changed. It returns the ones
// it leaves for later (not due yet).
func deleteDueChains(x *nftlib.Tx, have, want *nftlib.Table, keys, pending []string, due func(chain string) bool) (kept []string) {
	wanted := map[string]bool{}
	for _, key := range keys {
		if fr := want.Fragments[key]; fr != nil && fr != have.Fragments[key] {
			for _, c := range fr.Chains {
				wanted[c.Name] = true
			}
		}
	}
	for _, name := range pending {
		switch {
		case wanted[name] || want.FixedChain(name) != nil:
		case due(name):
			x.DelChains = append(x.DelChains, name)
		default:
			kept = append(kept, name)
		}
	}
	return kept
}

// anyDue reports whether some chain may be deleted at now: a sync that
// has work of its own.
func (s *staleChains) anyDue(now time.Time) bool {
	for id, chains := range s.pending {
		if slices.ContainsFunc(chains, s.due(id, now)) {
			return true
		}
	}
	return false
}

// keep records the chains left to delete after a successful sync: the
// ones it flushed (stale since now) and the older ones not due yet (kept).
// It returns when the first of them is due (zero: none left).
func (s *staleChains) keep(stale, kept map[tableID][]string, now time.Time) time.Time {
	pending := map[tableID][]string{}
	since := map[tableID]map[string]time.Time{}
	var first time.Time
	add := func(id tableID, chain string, at time.Time) {
		if since[id] == nil {
			since[id] = map[string]time.Time{}
		}
		if _, dup := since[id][chain]; dup {
			return
		}
		pending[id] = append(pending[id], chain)
		since[id][chain] = at
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	for _, id := range tableIDs() {
		for _, chain := range kept[id] {
			add(id, chain, s.since[id][chain])
		}
		for _, chain := range stale[id] {
			add(id, chain, now)
		}
	}
	s.pending, s.since = pending, since
	if first.IsZero() {
		return time.Time{}
	}
	return first.Add(staleChainAge)
}
