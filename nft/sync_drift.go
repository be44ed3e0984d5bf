package nft

import (
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// driftChecker finds out whether the kernel still holds what we applied.
// It asks for the ruleset generation; when another transaction than ours
// committed since the last verified state, it reads back and compares
// (every attribute, rule and element) only the tables that the change
// monitor saw another process change, or all of them when the monitor
// lost events or could not be opened.
type driftChecker struct {
	k   nftlib.Dataplane
	log *slog.Logger
	// every is how often a sync checks (0: never); onForeign and onDrift
	// are BackendConfig's OnForeignChange and OnDrift.
	every     time.Duration
	lastCheck time.Time
	onForeign func()
	onDrift   func(table string, diffs []string)

	// monTried is set once the first sync with every tried to open the
	// change monitor; readAll makes the next check read every table (the
	// monitor was opened after tables were written).
	monTried, readAll bool

	// repairs, after a check that found differences only in the chains
	// and maps whose rules and elements alone another process changed,
	// rewrite those in place (see Backend.repairInPlace).
	repairs []*nftlib.Tx

	// verifiedGen is the ruleset generation at which the kernel was known
	// to hold exactly what was applied (valid when verified).
	verifiedGen uint32
	verified    bool
}

// start opens the change monitor before the first check needs it
// (normally before the first, full, sync); without one, checks read every
// table back whenever the generation moved. applied says whether tables
// were written already.
func (c *driftChecker) start(cfg Config, applied bool) {
	if c.every <= 0 || c.monTried {
		return
	}
	c.monTried = true
	if c.k.Monitor() != nil {
		return
	}
	var watch []nftlib.TableRef
	for _, id := range tableIDs() {
		watch = append(watch, nftlib.TableRef{Family: id.f, Name: tableNameOf(cfg, id.kind)})
	}
	if err := c.k.Watch(watch, nftlib.MonitorRcvBuf, c.onForeign); err != nil {
		c.log.Warn("cannot follow nftables changes; each drift check reads all our tables back when another process committed", "err", err)
		return
	}
	// Changes made before the monitor was there are unknown, unless the
	// next sync rewrites everything anyway.
	c.readAll = applied
}

func tableNameOf(cfg Config, kind TableKind) string {
	return BuildTable(nftlib.IPv4, cfg, model.Node{}, kind).Name
}

// due reports whether a sync checks first: every `every`, and at once
// when the monitor saw another process change one of our tables.
func (c *driftChecker) due() bool {
	if c.every > 0 && time.Since(c.lastCheck) >= c.every {
		return true
	}
	m := c.k.Monitor()
	return m != nil && m.Pending()
}

// drifted reports whether the kernel holds something else than applied:
// nothing when the generation is the verified one and the monitor saw no
// change; else the tables the monitor saw another process change (all of
// them without a monitor, or when it lost events) are read back and
// compared with the applied ones (applied names them, rebuild gives them
// whole): only what the monitor says changed (see nftlib.ChangeScope),
// when it can be compared alone. Differences are logged and handed to
// onDrift; when every table with differences was compared that way,
// repairs holds the transactions that repair them in place (see
// Backend.repairInPlace). pending are the stale chains each table may
// still hold.
func (c *driftChecker) drifted(applied map[tableID]*nftlib.Table, rebuild func([]tableID) map[tableID]*nftlib.Table, pending map[tableID][]string) bool {
	c.lastCheck = time.Now()
	c.repairs = nil
	// The monitor first: every event it has read belongs to a transaction
	// the generation read after it counts.
	var scopes map[nftlib.TableRef]nftlib.ChangeScope
	m := c.k.Monitor()
	all, lost := m == nil || c.readAll, false
	if m != nil {
		scopes, lost = m.TakeScopes()
	}
	c.readAll = false
	gen, genErr := c.k.Generation()
	if genErr == nil && c.verified && gen == c.verifiedGen && !lost && len(scopes) == 0 {
		return false
	}
	c.verified = false
	var ids []tableID
	scoped := map[tableID]nftlib.ChangeScope{}
	for _, id := range tableIDs() {
		sc, marked := scopes[nftlib.TableRef{Family: id.f, Name: applied[id].Name}]
		if all || lost || marked {
			ids = append(ids, id)
		}
		if !all && !lost && marked {
			scoped[id] = sc
		}
	}
	found, err := c.checkTables(tablesFor(ids, scoped, applied, rebuild), scoped, pending)
	if err != nil {
		c.log.Warn("cannot read our nftables tables back; rewriting everything", "err", err)
		c.repairs = nil
		return true
	}
	if !found && genErr == nil {
		// Verified only if nobody committed while we read. A transaction
		// that the generation counts but whose events the monitor had not
		// yet read leaves marks, which keep the next check off the fast
		// path.
		after, err := c.k.Generation()
		c.verified, c.verifiedGen = err == nil && after == gen, gen
	}
	return found
}

// tablesFor gives the tables ids to compare: whole (rebuilt with their
// fragments) unless their scope needs only the fixed parts that applied
// holds (rebuilding a large main table costs more than the repair).
func tablesFor(ids []tableID, scoped map[tableID]nftlib.ChangeScope, applied map[tableID]*nftlib.Table, rebuild func([]tableID) map[tableID]*nftlib.Table) map[tableID]*nftlib.Table {
	out := map[tableID]*nftlib.Table{}
	var whole []tableID
	for _, id := range ids {
		if sc, ok := scoped[id]; ok && !needsFragments(sc, applied[id]) {
			out[id] = withoutFragments(applied[id])
		} else {
			whole = append(whole, id)
		}
	}
	maps.Copy(out, rebuild(whole))
	return out
}

// needsFragments reports whether comparing what sc names needs the
// Service ports' fragments: one of our maps (their elements are the
// fragments'), or a chain that is not a fixed one and may be a Service
// port's (all are named KUBE-...; any other name is not ours).
func needsFragments(sc nftlib.ChangeScope, fixed *nftlib.Table) bool {
	for name := range sc.Sets {
		if fixed.Map(name) != nil {
			return true
		}
	}
	for name := range sc.Chains {
		if fixed.FixedChain(name) == nil && strings.HasPrefix(name, "KUBE-") {
			return true
		}
	}
	return false
}

// checkTables reads back and compares the given tables: of those in
// scoped, what their scope names only; the others whole (and those whose
// scope cannot be compared alone). It sets repairs when every difference
// was found in a scope.
func (c *driftChecker) checkTables(tables map[tableID]*nftlib.Table, scoped map[tableID]nftlib.ChangeScope, pending map[tableID][]string) (bool, error) {
	whole := map[tableID]*nftlib.Table{}
	found := false
	var inPlace []*nftlib.Tx
	for _, id := range tableIDs() {
		t := tables[id]
		sc, ok := scoped[id]
		if t == nil {
			continue
		}
		if !ok {
			whole[id] = t
			continue
		}
		diffs, repair, err := c.k.ScopedDrift(t, sc, pending[id])
		if err != nil {
			c.log.Debug("comparing the whole table", "table", t.Name, "why", err)
			whole[id] = t
			continue
		}
		if len(diffs) > 0 {
			found = true
			c.report(t, diffs, "rewriting what another process changed")
			inPlace = append(inPlace, repair...)
		}
	}
	foundWhole, err := c.checkWhole(whole, pending)
	if err != nil {
		return false, err
	}
	if found && !foundWhole {
		c.repairs = inPlace
	}
	return found || foundWhole, nil
}

// checkWhole reads back and compares the given tables whole.
func (c *driftChecker) checkWhole(tables map[tableID]*nftlib.Table, pending map[tableID][]string) (bool, error) {
	if len(tables) == 0 {
		return false, nil
	}
	kts, err := readKernel(c.k, tables, pending)
	if err != nil {
		return false, err
	}
	found := false
	for _, id := range tableIDs() {
		t := tables[id]
		if t == nil {
			continue
		}
		diffs, err := c.k.TableDrift(t, kts[id], pending[id])
		if err != nil {
			return false, err
		}
		if len(diffs) > 0 {
			found = true
			c.report(t, diffs, "rewriting everything")
		}
	}
	return found, nil
}

// report logs the differences found in t and hands them to onDrift.
func (c *driftChecker) report(t *nftlib.Table, diffs []string, action string) {
	name := t.Family.String() + " " + t.Name
	c.log.Warn("nftables table changed behind our back; "+action, "table", name, "differences", diffs)
	if c.onDrift != nil {
		c.onDrift(name, diffs)
	}
}

// committed keeps the verified generation across our own transaction: the
// kernel still holds exactly what was applied when it did before (the
// generation read just before the commit is the verified one) and only
// our commits moved it.
func (c *driftChecker) committed(r commitReport) {
	if !r.ok() || !c.verified || r.genBefore != c.verifiedGen {
		c.verified = false
		return
	}
	after, err := c.k.Generation()
	c.verified = err == nil && after == r.genBefore+r.commits
	c.verifiedGen = after
}
