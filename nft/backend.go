package nft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Backend is the nftables backend: it turns each State into tables and makes
// the kernel match them with one transaction per sync.
//
// Each family has a main, a delta and an affinity table (see deltaSuffix
// and affinitySuffix). A full sync puts every service port in the main
// table but those with session affinity, which live in the affinity table
// for good. Afterwards a changed service port moves to the delta table, so
// that only the small delta table needs the kernel's validation walk; a
// fold moves the delta back into the main table when the delta has grown or
// when a sync has nothing else to do.
type Backend struct {
	cfg Config
	k   *Kernel
	log *slog.Logger

	// Trace, when set, receives each transaction as nft commands.
	Trace io.Writer

	// FoldAt is how many service ports the delta may hold before a sync
	// folds it, whatever else it does; 0 means max(64, services/16).
	FoldAt int

	// CheckEvery is how often a sync first checks that the kernel still
	// holds what we wrote (0: never). The check asks for the ruleset
	// generation; when another transaction than ours committed since the
	// last verified state, it reads back and compares (every attribute,
	// rule and element) only the tables that a change monitor saw another
	// process change, or all of them when the monitor lost events or could
	// not be opened. Any difference makes the sync a full one, which
	// rewrites it in one transaction.
	CheckEvery time.Duration
	lastCheck  time.Time

	// monTried is set once the first sync with CheckEvery tried to open
	// the change monitor; readAll makes the next check read every table
	// (the monitor was opened after tables were written).
	monTried, readAll bool
	// monitorBuf is the monitor's receive buffer (0: monitorRcvBuf), for
	// tests that make it overflow.
	monitorBuf int
	// readBacks counts the tables the checks read back (for tests).
	readBacks int

	// OnForeignChange, when set, is called (from another goroutine, once
	// per run of changes) when the change monitor sees another process
	// change one of our tables: a sync now checks and repairs them rather
	// than waiting for CheckEvery. Set it before the first Sync.
	OnForeignChange func()

	// OnDrift, when set, is called for each table in which a check found
	// differences, with short descriptions of them.
	OnDrift func(table string, diffs []string)

	// verifiedGen is the generation at which the kernel was known to hold
	// exactly applied (valid when verified).
	verifiedGen uint32
	verified    bool

	// applied is what the kernel holds since the last successful sync.
	applied map[tableID]*Table
	// inDelta holds the service ports that live in the delta tables (only
	// those: its size is the delta's).
	inDelta map[proxier.ServicePortName]bool
	// inputs are what each applied fragment was built from, so that an
	// unchanged service port reuses its fragment and the diff skips it.
	inputs map[proxier.ServicePortName]fragmentInput
	// known maps each applied ServicePort object to its endpoints: sources
	// hand over the same objects for unchanged ports, found here without
	// hashing names.
	known map[*proxier.ServicePort][]proxier.Endpoint
	node  proxier.Node
	// pending are chains flushed by earlier transactions, to delete once
	// they have been stale for staleChainAge (staleSince: since when).
	pending    map[tableID][]string
	staleSince map[tableID]map[string]time.Time
	// now is the clock of staleSince (tests move it).
	now      func() time.Time
	needFull bool
	// replace holds the tables whose repair the kernel refused: the next
	// full sync deletes and creates them again whole, in its one
	// transaction, whatever they hold (see markReplace).
	replace map[tableID]bool
	// lineage and stateGen identify the State applied last, so that the
	// next one's Delta (if it follows) says what changed.
	lineage  *proxier.Lineage
	stateGen uint64
}

// staleChainAge is how long a chain stays after the transaction that
// flushed it (and removed the map elements pointing to it) before one
// deletes it: kernels before 6.2 release a chain referenced from a deleted
// verdict map element only a little after the commit, and refuse to delete
// it until then (upstream's nftables mode waits as long). Sync asks for a
// follow-up sync at that time (SyncResult.FollowUpAt), so that emptied
// chains do not stay until the next periodic sync.
const staleChainAge = time.Second

type tableID struct {
	f    Family
	kind TableKind
}

type fragmentInput struct {
	svc *proxier.ServicePort
	eps []proxier.Endpoint
}

var _ proxier.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs through k.
func NewBackend(cfg Config, k *Kernel, log *slog.Logger) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{cfg: cfg, k: k, log: log, needFull: true, now: time.Now}, nil
}

// ForceFull makes the next sync rewrite everything (e.g. after a drift check).
func (b *Backend) ForceFull() { b.needFull = true }

// allTableIDs are our tables: per family a main, a delta and an affinity one.
var allTableIDs = func() []tableID {
	var ids []tableID
	for _, f := range families {
		for _, k := range []TableKind{MainTable, DeltaTable, AffinityTable} {
			ids = append(ids, tableID{f, k})
		}
	}
	return ids
}()

func tableIDs() []tableID { return allTableIDs }

// Sync programs st. The first sync and the one after a failure rewrite
// everything; the others send only what changed, and cost time in
// proportion to what changed: a State whose Delta follows the one applied
// last is looked at only where the Delta says it changed; any other is
// compared by pointer per service port (sources hand over States that
// share unchanged ServicePorts and endpoint slices).
func (b *Backend) Sync(ctx context.Context, st *proxier.State) (proxier.SyncResult, error) {
	if err := ctx.Err(); err != nil {
		return proxier.SyncResult{}, err
	}
	if b.CheckEvery > 0 && !b.monTried {
		b.openMonitor()
	}
	full := b.needFull || b.applied == nil || !b.node.Equal(st.Node)
	// Checked every CheckEvery, and at once when the monitor saw another
	// process change one of our tables.
	if !full && (b.checkDue() || b.k.mon != nil && b.k.mon.pending()) {
		full = b.drifted()
	}
	want, have := map[tableID]*Table{}, map[tableID]*Table{}
	var names []proxier.ServicePortName // the service ports the diff must look at
	inDelta := b.inDelta
	now := b.now()
	due := func(id tableID) func(string) bool {
		return func(chain string) bool { return now.Sub(b.staleSince[id][chain]) >= staleChainAge }
	}
	cleanupDue := false // stale chains to delete: a sync with work of its own
	for id, chains := range b.pending {
		cleanupDue = cleanupDue || slices.ContainsFunc(chains, due(id))
	}
	if full {
		inDelta = map[proxier.ServicePortName]bool{}
		for _, id := range tableIDs() {
			want[id] = BuildTable(id.f, b.cfg, st.Node, id.kind)
		}
		b.placeAll(want, st)
	} else {
		// The applied tables are updated in place (cloning maps of every
		// service port would cost more than the rest of a small sync);
		// have keeps what was replaced, for the diff and to undo a failure.
		for _, id := range tableIDs() {
			t := *b.applied[id]
			t.Services = map[proxier.ServicePortName]*Fragment{}
			have[id] = &t
			want[id] = b.applied[id]
		}
		inDelta = maps.Clone(inDelta)
		added := 0
		// examine moves a service port that differs from what was
		// applied (added, changed or removed) to its new table.
		examine := func(name proxier.ServicePortName) {
			svc, ok := st.Services[name]
			if !ok {
				if _, had := b.inputs[name]; had {
					names = append(names, name)
					b.remember(have, want, name)
					b.unplace(want, name)
					delete(inDelta, name)
				}
				return
			}
			eps := st.Endpoints[name]
			if known, ok := b.known[svc]; ok && sameEndpoints(known, eps) {
				return // the very ServicePort we applied: no lookup by name
			}
			in, ok := b.inputs[name]
			if ok && sameInput(in, svc, eps) {
				return
			}
			if !ok {
				added++
			}
			names = append(names, name)
			b.remember(have, want, name)
			b.unplace(want, name)
			// A changed port goes to the delta table, unless its home
			// is the affinity table.
			kind := homeTable(svc)
			if kind == MainTable {
				kind = DeltaTable
				inDelta[name] = true
			} else {
				delete(inDelta, name)
			}
			b.place(want, name, kind, st.Node, svc, eps)
		}
		if st.Delta.Follows(b.lineage, b.stateGen) {
			// The source says which service ports changed since the State
			// applied last: only those are looked at.
			seen := make(map[proxier.ServicePortName]bool, len(st.Delta.Changed))
			for _, name := range st.Delta.Changed {
				if !seen[name] { // a Service changed twice is listed twice
					seen[name] = true
					examine(name)
				}
			}
		} else if !b.sameState(st) {
			for name := range st.Services {
				examine(name)
			}
			if len(b.inputs)+added != len(st.Services) {
				for name := range b.inputs {
					if _, ok := st.Services[name]; !ok {
						examine(name)
					}
				}
			}
		}
		if b.shouldFold(len(names), cleanupDue, inDelta, len(st.Services)) {
			changed := make(map[proxier.ServicePortName]bool, len(names))
			for _, name := range names {
				changed[name] = true
			}
			for name := range inDelta {
				if !changed[name] { // a port is diffed once, wherever it goes
					names = append(names, name)
				}
				b.remember(have, want, name)
				for _, f := range families {
					if fr := want[tableID{f, DeltaTable}].Services[name]; fr != nil {
						want[tableID{f, MainTable}].Services[name] = fr
						delete(want[tableID{f, DeltaTable}].Services, name)
					}
				}
			}
			inDelta = map[proxier.ServicePortName]bool{}
		}
	}

	var kts map[tableID]*kTable
	if full {
		var err error
		if kts, err = b.readKernel(want); err != nil {
			return proxier.SyncResult{}, err
		}
	}
	bt := b.k.newBatch()
	stale, kept := map[tableID][]string{}, map[tableID][]string{}
	var setID uint32
	anything := false
	deleted := 0
	for _, id := range tableIDs() {
		var x *tx
		if full {
			x, stale[id] = fullTx(want[id], kts[id], b.replace[id])
		} else {
			x, stale[id], kept[id] = diffTx(have[id], want[id], names, b.pending[id], due(id))
		}
		deleted += len(x.delChains)
		if !x.empty() {
			anything = true
			id0 := setID
			x.write(bt, &setID)
			if b.Trace != nil {
				var sw scriptWriter
				x.write(&sw, &id0)
				io.WriteString(b.Trace, sw.b.String())
			}
		}
	}
	res := proxier.SyncResult{Full: full, Changed: anything, Messages: bt.messages(), StaleChainsDeleted: deleted,
		CleanupOnly: !full && len(names) == 0 && deleted > 0}
	if anything {
		res.Bytes = bt.size()
		gen, genErr := b.k.Generation()
		muted := b.k.mon != nil && bt.messages() >= muteAbove && b.k.mon.setMember(false) == nil
		start := time.Now()
		err := b.k.Apply(bt)
		res.Kernel = time.Since(start)
		b.k.finished(bt)
		commits := uint32(0)
		if err == nil {
			commits++
			if full && bt.messages() >= settleFrom && b.settle(want) == nil {
				commits++
			}
		}
		if muted {
			b.rejoin(gen, genErr, commits)
		}
		b.committed(gen, genErr == nil && err == nil, commits)
		if err != nil {
			b.needFull = true
			if full {
				b.markReplace(err, want)
			} else {
				b.undo(have)
			}
			return res, fmt.Errorf("applying nftables generation: %w", err)
		}
	}
	b.replace = nil
	b.applied = want
	b.lineage, b.stateGen = st.Delta.Lineage, st.Delta.Gen
	res.FollowUpAt = b.keepStale(stale, kept, b.now())
	b.needFull = false
	b.node = st.Node
	b.inDelta = inDelta
	if full {
		b.inputs = make(map[proxier.ServicePortName]fragmentInput, len(st.Services))
		b.known = make(map[*proxier.ServicePort][]proxier.Endpoint, len(st.Services))
		for name, svc := range st.Services {
			b.inputs[name] = fragmentInput{svc: svc, eps: st.Endpoints[name]}
			b.known[svc] = st.Endpoints[name]
		}
	} else {
		for _, name := range names {
			delete(b.known, b.inputs[name].svc)
			if svc, ok := st.Services[name]; ok {
				b.inputs[name] = fragmentInput{svc: svc, eps: st.Endpoints[name]}
				b.known[svc] = st.Endpoints[name]
			} else {
				delete(b.inputs, name)
			}
		}
	}
	return res, nil
}

// markReplace makes the next full sync replace the table whose full sync
// the kernel refused (err), or all of them when the refusal names none of
// ours or its answer was lost (a refusal of thousands of messages can
// overflow the socket's receive buffer, so that no TxError says which).
// A full sync repairs in place whatever we know of; what the kernel still
// refuses (another process's object we cannot delete alone, a limit we do
// not read back) goes with the table, so that a sync never fails for ever
// on our own table. The replacement loses the affinity set's entries, if
// it is that table, and only then.
func (b *Backend) markReplace(err error, want map[tableID]*Table) {
	if b.replace == nil {
		b.replace = map[tableID]bool{}
	}
	var txErr *TxError
	named, which := false, "all"
	if errors.As(err, &txErr) {
		for _, id := range tableIDs() {
			if id.f == txErr.Family && want[id].Name == txErr.Table {
				b.replace[id], named = true, true
			}
		}
		if named {
			which = txErr.Family.String() + " " + txErr.Table
		}
	}
	if !named {
		for _, id := range tableIDs() {
			b.replace[id] = true
		}
	}
	b.log.Warn("the kernel refused to repair our nftables tables in place; the next sync replaces them whole",
		"table", which, "err", err)
}

// keepStale records the chains left to delete after a successful sync: the
// ones it flushed (stale since now) and the older ones not due yet. It
// returns when the first of them is due (zero: none left).
func (b *Backend) keepStale(stale, kept map[tableID][]string, now time.Time) time.Time {
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
			add(id, chain, b.staleSince[id][chain])
		}
		for _, chain := range stale[id] {
			add(id, chain, now)
		}
	}
	b.pending, b.staleSince = pending, since
	if first.IsZero() {
		return time.Time{}
	}
	return first.Add(staleChainAge)
}

func (b *Backend) checkDue() bool {
	return b.applied != nil && b.CheckEvery > 0 && time.Since(b.lastCheck) >= b.CheckEvery
}

// committed keeps the verified generation across our own transaction: the
// kernel still holds exactly applied when it did before (gen, read just
// before the commit, is the verified one) and only our commit moved it.
func (b *Backend) committed(gen uint32, ok bool, commits uint32) {
	if !ok || !b.verified || gen != b.verifiedGen {
		b.verified = false
		return
	}
	after, err := b.k.Generation()
	b.verified = err == nil && after == gen+commits
	b.verifiedGen = after
}

// settleChain is the chain settle adds and deletes: not a name we build
// (ours are upper case or hook names).
const settleChain = "kube-nftproxy-settle"

// settleFrom is the size of a full sync (messages) from which settle
// follows it: below, the chains are few and their walk costs little.
const settleFrom = 10000

// settle commits a transaction that changes nothing (a chain added and
// deleted) right after a full sync. Every commit walks every chain of the
// namespace, and the first one after a full sync also hands each chain's
// rules of the generation before to RCU to free: at 10k Services that made
// the next one-Service change cost 11-17 ms instead of 6 ms. Done here, it
// is part of the full sync and not of the change that follows.
func (b *Backend) settle(want map[tableID]*Table) error {
	id := tableIDs()[0]
	bt := b.k.newBatch()
	bt.addChain(id.f, want[id].Name, &Chain{Name: settleChain})
	bt.delChain(id.f, want[id].Name, settleChain)
	err := b.k.Apply(bt)
	b.k.finished(bt)
	if err != nil {
		b.log.Warn("could not commit the transaction that settles a full sync; the next sync pays for it", "err", err)
	}
	return err
}

// muteAbove is the transaction size (messages) from which the change
// monitor leaves the notification group while we commit: below it, the
// kernel's cost of notifying is small, and staying in the group keeps
// other writers' changes in view.
const muteAbove = 1024

// rejoin puts the monitor back into the notification group after one of
// our transactions (before is the generation read before the monitor left
// it). Another process's commit in between went unseen: when the
// generation shows one, every table is marked for the next check.
func (b *Backend) rejoin(before uint32, beforeErr error, commits uint32) {
	joinErr := b.k.mon.setMember(true)
	after, err := b.k.Generation()
	want := before + commits
	if joinErr != nil || beforeErr != nil || err != nil || after != want {
		b.k.mon.markAll()
	}
	if joinErr != nil {
		b.log.Warn("cannot rejoin the nftables notification group; drift checks read all tables back", "err", joinErr)
	}
}

// openMonitor opens the change monitor before the first check needs it
// (normally before the first, full, sync); without one, checks read every
// table back whenever the generation moved.
func (b *Backend) openMonitor() {
	b.monTried = true
	if b.k.mon != nil {
		return
	}
	var watch []tableName
	for _, id := range tableIDs() {
		watch = append(watch, tableName{id.f, tableNameOf(b.cfg, id.kind)})
	}
	size := b.monitorBuf
	if size == 0 {
		size = monitorRcvBuf
	}
	m, err := b.k.openMonitor(watch, size, b.OnForeignChange)
	if err != nil {
		b.log.Warn("cannot follow nftables changes; each drift check reads all our tables back when another process committed", "err", err)
		return
	}
	b.k.mon = m
	// Changes made before the monitor was there are unknown, unless the
	// next sync rewrites everything anyway.
	b.readAll = b.applied != nil
}

func tableNameOf(cfg Config, kind TableKind) string {
	return BuildTable(IPv4, cfg, proxier.Node{}, kind).Name
}

// drifted reports whether the kernel holds something else than what we
// applied: nothing when the generation is the verified one and the
// monitor saw no change; else the tables the monitor saw another process
// change (all of them without a monitor, or when it lost events) are read
// back and compared with the applied ones. Differences are logged and
// handed to OnDrift.
func (b *Backend) drifted() bool {
	b.lastCheck = time.Now()
	// The monitor first: every event it has read belongs to a transaction
	// the generation read after it counts.
	var marked map[tableName]bool
	all, lost := b.k.mon == nil || b.readAll, false
	if b.k.mon != nil {
		marked, lost = b.k.mon.take()
	}
	b.readAll = false
	gen, genErr := b.k.Generation()
	if genErr == nil && b.verified && gen == b.verifiedGen && !lost && len(marked) == 0 {
		return false
	}
	b.verified = false
	check := map[tableID]*Table{}
	for _, id := range tableIDs() {
		if t := b.applied[id]; all || lost || marked[tableName{id.f, t.Name}] {
			check[id] = t
		}
	}
	found, err := b.checkTables(check)
	if err != nil {
		b.log.Warn("cannot read our nftables tables back; rewriting everything", "err", err)
		return true
	}
	if !found && genErr == nil {
		// Verified only if nobody committed while we read. A transaction
		// that the generation counts but whose events the monitor had not
		// yet read leaves marks, which keep the next check off the fast
		// path.
		after, err := b.k.Generation()
		b.verified, b.verifiedGen = err == nil && after == gen, gen
	}
	return found
}

// checkTables reads back and compares the given tables.
func (b *Backend) checkTables(tables map[tableID]*Table) (bool, error) {
	if len(tables) == 0 {
		return false, nil
	}
	b.readBacks += len(tables)
	kts, err := b.readKernel(tables)
	if err != nil {
		return false, err
	}
	found := false
	for _, id := range tableIDs() {
		t := tables[id]
		if t == nil {
			continue
		}
		diffs, err := b.k.tableDrift(t, kts[id], b.pending[id])
		if err != nil {
			return false, err
		}
		if len(diffs) == 0 {
			continue
		}
		found = true
		name := t.Family.String() + " " + t.Name
		b.log.Warn("nftables table changed behind our back; rewriting everything", "table", name, "differences", diffs)
		if b.OnDrift != nil {
			b.OnDrift(name, diffs)
		}
	}
	return found, nil
}

// sameState reports whether st is the State applied last (a periodic
// sync, or a follow-up that deletes stale chains): nothing to look at.
func (b *Backend) sameState(st *proxier.State) bool {
	return st.Delta.Lineage != nil && st.Delta.Lineage == b.lineage && st.Delta.Gen == b.stateGen
}

// sameInput reports whether a service port is what its fragment was built
// from: by pointer first (the cheap, common case), else by value.
func sameInput(in fragmentInput, svc *proxier.ServicePort, eps []proxier.Endpoint) bool {
	if in.svc != svc && !in.svc.Equal(svc) {
		return false
	}
	return sameEndpoints(in.eps, eps)
}

func sameEndpoints(a, b []proxier.Endpoint) bool {
	if len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) {
		return true
	}
	return proxier.EndpointsEqual(a, b)
}

// remember saves, once per sync, what the applied tables hold for a service
// port before it is changed: have[id].Services gets the old fragment, or nil
// when there was none.
func (b *Backend) remember(have, want map[tableID]*Table, name proxier.ServicePortName) {
	for _, id := range tableIDs() {
		if _, done := have[id].Services[name]; !done {
			have[id].Services[name] = want[id].Services[name]
		}
	}
}

// undo puts back what remember saved, after a failed transaction.
func (b *Backend) undo(have map[tableID]*Table) {
	for id, t := range have {
		for name, fr := range t.Services {
			if fr == nil {
				delete(b.applied[id].Services, name)
			} else {
				b.applied[id].Services[name] = fr
			}
		}
	}
}

// place builds a service port's fragments into the tables of that kind.
func (b *Backend) place(want map[tableID]*Table, name proxier.ServicePortName, kind TableKind, node proxier.Node, svc *proxier.ServicePort, eps []proxier.Endpoint) {
	for _, f := range families {
		if fr := BuildFragment(f, b.cfg, node, svc, eps); fr != nil {
			want[tableID{f, kind}].Services[name] = fr
		}
	}
}

// placeAll builds every service port of st into the tables of its home,
// the fragments on all CPUs (they depend on their own inputs alone).
func (b *Backend) placeAll(want map[tableID]*Table, st *proxier.State) {
	names := make([]proxier.ServicePortName, 0, len(st.Services))
	for name := range st.Services {
		names = append(names, name)
	}
	built := make([][2]*Fragment, len(names)) // per family: IPv4, IPv6
	inParallel(len(names), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			svc := st.Services[names[i]]
			for j, f := range families {
				built[i][j] = BuildFragment(f, b.cfg, st.Node, svc, st.Endpoints[names[i]])
			}
		}
	})
	for i, name := range names {
		kind := homeTable(st.Services[name])
		for j, f := range families {
			if fr := built[i][j]; fr != nil {
				want[tableID{f, kind}].Services[name] = fr
			}
		}
	}
}

// unplace removes a service port from whichever table holds it.
func (b *Backend) unplace(want map[tableID]*Table, name proxier.ServicePortName) {
	for _, id := range tableIDs() {
		delete(want[id].Services, name)
	}
}

// shouldFold folds the delta into the main table when a sync has no change
// of its own to make (a periodic sync; not the follow-up that deletes stale
// chains, which would otherwise fold a second after every change), or when
// the delta has grown so that validating it costs more than a fold is
// worth.
func (b *Backend) shouldFold(changed int, cleanupDue bool, inDelta map[proxier.ServicePortName]bool, total int) bool {
	n := len(inDelta)
	if n == 0 {
		return false
	}
	limit := b.FoldAt
	if limit == 0 {
		limit = max(64, total/16)
	}
	return changed == 0 && !cleanupDue || n > limit
}

// homeTable is where a full sync puts a service port: the affinity table
// for those with session affinity, whose clients' affinities are entries of
// that table's set and would be lost on a move; the main table otherwise.
func homeTable(svc *proxier.ServicePort) TableKind {
	if svc != nil && svc.AffinityTimeout > 0 {
		return AffinityTable
	}
	return MainTable
}

// readKernel reads what the kernel holds of the given tables (their
// metadata, not rules or elements), and refuses tables another process owns.
func (b *Backend) readKernel(tables map[tableID]*Table) (map[tableID]*kTable, error) {
	out := make(map[tableID]*kTable, len(tables))
	me := b.k.portID()
	for _, f := range families {
		var names []string
		expect := map[string][]string{}
		for _, id := range tableIDs() {
			if t := tables[id]; id.f == f && t != nil {
				names = append(names, t.Name)
				// Our chains, and those flushed for deletion that may remain.
				want := make([]string, 0, t.chainCount()+len(b.pending[id]))
				t.eachChain(func(c *Chain) { want = append(want, c.Name) })
				expect[t.Name] = append(want, b.pending[id]...)
			}
		}
		if len(names) == 0 {
			continue
		}
		kts, err := b.k.readFamily(f, names, expect)
		if err != nil {
			return nil, err
		}
		for _, id := range tableIDs() {
			if id.f != f || tables[id] == nil {
				continue
			}
			kt := kts[tables[id].Name]
			if kt.exists && kt.flags&nftTableFOwner != 0 && kt.owner != me {
				return nil, &TableOwnedError{Family: f, Table: tables[id].Name, Owner: kt.owner}
			}
			out[id] = kt
		}
	}
	return out, nil
}

// Cleanup deletes all our tables in one transaction.
func (b *Backend) Cleanup(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	tables := map[tableID]*Table{}
	for _, id := range tableIDs() {
		tables[id] = BuildTable(id.f, b.cfg, proxier.Node{}, id.kind)
	}
	kts, err := b.readKernel(tables)
	if err != nil {
		return false, err
	}
	bt := b.k.newBatch()
	for _, id := range tableIDs() {
		if kts[id].exists {
			bt.delTable(id.f, tables[id].Name)
		}
	}
	if bt.messages() == 0 {
		return false, nil
	}
	err = b.k.Apply(bt)
	b.k.finished(bt)
	b.verified = false
	if err != nil {
		return false, fmt.Errorf("deleting tables: %w", err)
	}
	b.applied, b.inputs, b.known, b.inDelta, b.needFull = nil, nil, nil, nil, true
	return true, nil
}
