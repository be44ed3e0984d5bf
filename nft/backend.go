package nft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
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
//
// A sync is plan (syncPlan: the tables wanted, and the service ports that
// moved), diff (syncDiff: one transaction per table), commit (committer)
// and record; a driftChecker decides beforehand whether the kernel still
// holds what was applied, staleChains when emptied chains may go.
type Backend struct {
	cfg   Config
	k     nftlib.Dataplane
	log   *slog.Logger
	check *driftChecker
	tx    *committer
	stale staleChains
	// changes knows the service ports applied, to tell which changed.
	changes model.ChangeTracker

	// applied is what the kernel holds since the last successful sync,
	// the tables' fixed parts: the fragments are rebuilt from the State
	// changes recorded when needed (see appliedPort).
	applied map[tableID]*nftlib.Table
	// inDelta holds the service ports that live in the delta tables (only
	// those: its size is the delta's).
	inDelta map[model.ServicePortName]bool
	node    model.Node
	// clusterIPs and serviceCIDRs are those of the applied State, for
	// Config.ClusterIPChecks (see clusterips.go).
	clusterIPs   clusterIPIndex
	serviceCIDRs []netip.Prefix
	needFull     bool
	// repaired is the transaction of this sync's repairInPlace, if any.
	repaired commitReport
	// replace holds the tables whose repair the kernel refused: the next
	// full sync deletes and creates them again whole, in its one
	// transaction, whatever they hold (see markReplace).
	replace map[tableID]bool
	// strategy is BackendConfig.Strategy with its defaults filled in;
	// settleAfter is the table whose settling transaction is due (nil:
	// none; see Strategy.DeferSettle).
	strategy    Strategy
	settleAfter *nftlib.TableRef
}

// BackendConfig is a Backend's configuration.
type BackendConfig struct {
	// Rules shapes the ruleset (kube-proxy's flags).
	Rules Config
	// Log receives warnings; nil discards them.
	Log *slog.Logger
	// Trace, when set, receives each transaction as nft commands.
	Trace io.Writer
	// Strategy is how syncs cut and send their work (zero: the
	// product's).
	Strategy Strategy
	// CheckEvery is how often a sync first checks that the kernel still
	// holds what we wrote (0: never); see driftChecker. Any difference
	// makes the sync a full one, which rewrites it in one transaction.
	CheckEvery time.Duration
	// OnForeignChange, when set, is called (from another goroutine, once
	// per run of changes) when the change monitor sees another process
	// change one of our tables: a sync now checks and repairs them rather
	// than waiting for CheckEvery.
	OnForeignChange func()
	// OnDrift, when set, is called for each table in which a check found
	// differences, with short descriptions of them.
	OnDrift func(table string, diffs []string)
}

type tableID struct {
	f    nftlib.Family
	kind TableKind
}

var _ proxier.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs through k.
func NewBackend(k nftlib.Dataplane, cfg BackendConfig) (*Backend, error) {
	if err := cfg.Rules.Validate(); err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{
		cfg: cfg.Rules, k: k, log: log, needFull: true, strategy: cfg.Strategy.withDefaults(),
		check: &driftChecker{k: k, log: log, every: cfg.CheckEvery, onForeign: cfg.OnForeignChange, onDrift: cfg.OnDrift},
		tx:    &committer{k: k, log: log, trace: cfg.Trace},
		stale: staleChains{now: time.Now},
	}, nil
}

// ForceFull makes the next sync rewrite everything (e.g. after a drift check).
func (b *Backend) ForceFull() { b.needFull = true }

// allTableIDs are our tables: per family a main, a delta and an affinity one.
var allTableIDs = func() []tableID {
	var ids []tableID
	for _, f := range nftlib.Families {
		for _, k := range []TableKind{MainTable, DeltaTable, AffinityTable} {
			ids = append(ids, tableID{f, k})
		}
	}
	return ids
}()

func tableIDs() []tableID { return allTableIDs }

// Sync programs st. The first sync and the one after a failure rewrite
// everything; the others send only what changed, and cost time in
// proportion to what changed (see model.ChangeTracker).
func (b *Backend) Sync(ctx context.Context, st *model.State) (proxier.SyncResult, error) {
	if err := ctx.Err(); err != nil {
		return proxier.SyncResult{}, err
	}
	b.Settle()
	b.repaired = commitReport{}
	ph := newSyncPhases()
	b.check.start(b.cfg, b.applied != nil)
	p := b.plan(st, b.wantsFull(st))
	ph.build = ph.lap()
	d, err := b.diff(p, ph)
	if err == nil && p.deferred != nil && !allFresh(d.txs) { // a table appeared since the plan looked
		b.placeDeferred(p)
		d, err = b.diff(p, ph)
	}
	if err != nil {
		// Refused before the commit (a table another process owns, a
		// read that failed): the kernel is not known to hold what was
		// applied, so the retry is a full sync too, not a partial one
		// that finds nothing to write and passes.
		b.needFull = true
		return proxier.SyncResult{}, err
	}
	ph.diff = ph.lap()
	res := proxier.SyncResult{Full: p.full, StaleChainsDeleted: d.deleted,
		CleanupOnly: !p.full && len(p.names) == 0 && d.deleted > 0}
	if err := b.apply(p, d, &res, ph); err != nil {
		return res, err
	}
	if r := b.repaired; r.err == nil && r.messages > 0 { // repairInPlace's transaction
		res.Changed, res.CleanupOnly = true, false
		res.Messages, res.Bytes, res.Kernel = res.Messages+r.messages, res.Bytes+r.bytes, res.Kernel+r.kernel
	}
	res.FollowUpAt = b.record(st, p, d)
	if p.full {
		ph.log(b.log)
	}
	return res, nil
}

// apply encodes the sync's transactions and commits them, reporting into
// res.
func (b *Backend) apply(p *syncPlan, d *syncDiff, res *proxier.SyncResult, ph *syncPhases) error {
	var r commitReport
	if p.deferred != nil {
		r = b.commit(p, func(settle *nftlib.TableRef) commitReport {
			return b.tx.commitStaged(b.stagedTxs(p, d.txs), d.txs, settle, b.strategy.OnLargeTxRound, b.strategy.StageReleaseBytes)
		})
		ph.staged = r.staged
	} else {
		rules := rulesOf(d.txs)
		var release func()
		if s := b.strategy; s.OnLargeTx != nil && rules >= s.LargeTxRules {
			defer s.OnLargeTx()()
			release = s.OnLargeTxRound
		}
		kt := b.tx.write(d.txs, b.strategy.releaseRound(rules), release)
		if kt == nil {
			return nil
		}
		ph.encode = ph.lap()
		r = b.commit(p, func(settle *nftlib.TableRef) commitReport { return b.tx.commit(kt, settle) })
	}
	ph.commit, ph.kernel, ph.settle = ph.lap()-r.settle, r.kernel, r.settle
	res.Changed, res.Messages, res.Bytes, res.Kernel = true, r.messages, r.bytes, r.kernel
	if r.err != nil {
		return fmt.Errorf("applying nftables generation: %w", r.err)
	}
	return nil
}

func rulesOf(txs []*nftlib.Tx) int {
	n := 0
	for _, x := range txs {
		n += x.Rules()
	}
	return n
}

// wantsFull reports whether st must be a full sync: the first, the one
// after a failure, a new node, or the kernel found to hold something else.
func (b *Backend) wantsFull(st *model.State) bool {
	if b.needFull || b.applied == nil || !b.node.Equal(st.Node) {
		return true
	}
	if !b.check.due() || !b.drifted() {
		return false
	}
	return !b.repairInPlace()
}

// repairInPlace rewrites the chains and maps the last check found
// changed, when another process changed only their rules and elements:
// one transaction as small as the change, after which the kernel holds what was applied and the sync
// goes on as a partial one. It reports false, and the sync is a full one,
// when the check found other differences or the kernel refused it.
func (b *Backend) repairInPlace() bool {
	txs := b.check.repairs
	b.check.repairs = nil
	kt := b.tx.write(txs, 0, nil)
	if kt == nil {
		return false
	}
	r := b.tx.commit(kt, nil)
	b.check.committed(r)
	b.repaired = r
	if r.err != nil {
		b.log.Warn("could not rewrite the changed chains in place; rewriting everything", "err", r.err)
		return false
	}
	return true
}

// drifted reports whether the kernel holds something else than applied.
func (b *Backend) drifted() bool {
	return b.check.drifted(b.applied, b.appliedTables, b.stale.pending)
}

// commit sends one sync's transaction with send, which settles it when
// given a table to settle. A refused one leaves the applied state as it
// was (a full sync's refusal marks tables to replace) and makes the next
// sync a full one.
func (b *Backend) commit(p *syncPlan, send func(settle *nftlib.TableRef) commitReport) commitReport {
	var settle *nftlib.TableRef
	if p.full {
		id := tableIDs()[0]
		settle = &nftlib.TableRef{Family: id.f, Name: p.want[id].Name}
	}
	if b.strategy.DeferSettle {
		r := send(nil)
		if r.err == nil && settle != nil && r.messages >= settleFrom {
			b.settleAfter = settle
		}
		return b.committed(p, r)
	}
	return b.committed(p, send(settle))
}

// committed accounts for a sync's commit, r.
func (b *Backend) committed(p *syncPlan, r commitReport) commitReport {
	b.check.committed(r)
	if r.err != nil {
		b.needFull = true
		if p.full {
			b.markReplace(r.err, p.want)
		}
	}
	return r
}

// Settle commits the transaction that settles the last full sync, when
// Strategy.DeferSettle left it to now (see committer.settle); otherwise it does
// nothing. The sync loop calls it once it has reported the sync.
func (b *Backend) Settle() {
	t := b.settleAfter
	if t == nil {
		return
	}
	b.settleAfter = nil
	start := time.Now()
	var r commitReport
	r.genBefore, r.genErr = b.k.Generation()
	if r.err = b.tx.settle(*t); r.err == nil {
		r.commits = 1
	}
	b.check.committed(r) // the verified generation survives our own commit
	b.log.Log(context.Background(), levelPhases, "settled the full sync", "took", time.Since(start))
}

// record makes a successful sync's plan the applied state; it returns
// when the next stale chain is due for deletion (zero: none).
func (b *Backend) record(st *model.State, p *syncPlan, d *syncDiff) time.Time {
	b.replace = nil
	b.applied = make(map[tableID]*nftlib.Table, len(p.want))
	for id, t := range p.want {
		b.applied[id] = withoutFragments(t)
	}
	b.needFull = false
	b.node = st.Node
	b.inDelta = p.inDelta
	b.recordClusterIPs(st, p)
	if p.full {
		b.changes.RecordAll(st)
	} else {
		b.changes.Record(st, p.changed)
	}
	return b.stale.keep(d.stale, d.kept, b.stale.now())
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
func (b *Backend) markReplace(err error, want map[tableID]*nftlib.Table) {
	if b.replace == nil {
		b.replace = map[tableID]bool{}
	}
	var txErr *nftlib.TxError
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

// homeTable is where a full sync puts a service port: the affinity table
// for those with session affinity, whose clients' affinities are entries of
// that table's set and would be lost on a move; the main table otherwise.
func homeTable(svc *model.ServicePort) TableKind {
	if svc != nil && svc.AffinityTimeout > 0 {
		return AffinityTable
	}
	return MainTable
}

// homeKind is homeTable as placeAll asks for it.
func homeKind(_ model.ServicePortName, svc *model.ServicePort) TableKind { return homeTable(svc) }

// Cleanup deletes all our tables in one transaction.
func (b *Backend) Cleanup(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	tables := map[tableID]*nftlib.Table{}
	for _, id := range tableIDs() {
		tables[id] = BuildTable(id.f, b.cfg, model.Node{}, id.kind)
	}
	kts, err := b.readKernel(tables)
	if err != nil {
		return false, err
	}
	kt := b.k.NewTx()
	for _, id := range tableIDs() {
		if kts[id].Exists {
			kt.DelTable(id.f, tables[id].Name)
		}
	}
	if kt.Messages() == 0 {
		return false, nil
	}
	err = b.k.CommitTx(kt)
	b.check.verified = false
	if err != nil {
		return false, fmt.Errorf("deleting tables: %w", err)
	}
	b.applied, b.inDelta, b.needFull, b.settleAfter = nil, nil, true, nil
	b.clusterIPs, b.serviceCIDRs = nil, nil
	b.changes.Reset()
	return true, nil
}
