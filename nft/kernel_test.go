package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// openTestBackend opens a Backend of rules cfg on a countingKernel in
// namespace ns.
func openTestBackend(t testing.TB, ns string, cfg Config) *Backend {
	t.Helper()
	return openTestBackendWith(t, ns, BackendConfig{Rules: cfg})
}

// openTestBackendWith opens a Backend of bc on a countingKernel in
// namespace ns; the drift its checks report goes to the kernel's drift,
// unless bc has an OnDrift of its own.
func openTestBackendWith(t testing.TB, ns string, bc BackendConfig) *Backend {
	t.Helper()
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	ck := &countingKernel{Kernel: k}
	if bc.OnDrift == nil {
		bc.OnDrift = func(_ string, diffs []string) { ck.drift = append(ck.drift, diffs...) }
	}
	b, err := NewBackend(ck, bc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The kernel must hold exactly what we render: this proves that the netlink
// bytecode of every term is what nft would emit for its text, since nft
// decompiles it back to the same text.
func TestKernelListingMatchesRender(t *testing.T) {
	for _, tc := range goldenCases(t) {
		for _, staged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/staged=%v", tc.name, staged), func(t *testing.T) {
				kernelListingMatchesRender(t, tc, staged)
			})
		}
	}
}

// kernelListingMatchesRender syncs tc into a new namespace, staged (each
// service port's chains a transaction of their own) or not, and compares
// nft's listing with what render prints.
func kernelListingMatchesRender(t *testing.T, tc goldenCase, staged bool) {
	ns := testns.New(t, "knp-nft-")
	bc := BackendConfig{Rules: tc.cfg}
	if staged {
		bc.Strategy.StageRules, bc.Strategy.StagePieces = 1, 1<<20
	}
	b := openTestBackendWith(t, ns, bc)
	res, err := b.Sync(context.Background(), tc.st)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full {
		t.Errorf("first sync was not full")
	}
	want := Build(tc.st, tc.cfg).String()
	got := testns.NFT(t, ns, "list", "ruleset")
	if testutil.SortedText(got) != testutil.SortedText(want) {
		t.Errorf("kernel listing differs from render\n--- kernel:\n%s\n--- render:\n%s", got, want)
	}
}

// fakeClock puts b's stale-chain clock under the test's control; the
// returned function moves it on.
func fakeClock(b *Backend) (advance func(time.Duration)) {
	now := time.Now()
	b.stale.now = func() time.Time { return now }
	return func(d time.Duration) { now = now.Add(d) }
}

// A changed service moves to the delta table, and the main table's chains
// it leaves are deleted by a follow-up sync staleChainAge later (which does
// nothing else: no fold); a sync with nothing to change folds the delta
// back, and its follow-up deletes the chains left over, after which the
// kernel again holds exactly the full-sync ruleset.
func TestKernelDeltaAndFold(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackend(t, ns, demoConfig())
	advance := fakeClock(b)
	ctx := context.Background()
	st := demoState()
	if _, err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	web := demoState()
	name := proxierName("default", "web", "http")
	web.Endpoints.Get(name)[1].Addr = mustAddr("10.244.0.12")
	res, err := b.Sync(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	if res.Full || !res.Changed {
		t.Fatalf("endpoint change: full=%v changed=%v, want a partial sync", res.Full, res.Changed)
	}
	delta := testns.NFT(t, ns, "list", "table", "ip", "kube-nftproxy-delta")
	main := testns.NFT(t, ns, "list", "table", "ip", "kube-nftproxy")
	for _, want := range []string{"dnat to 10.244.0.12:8080", "10.96.0.10 . tcp . 80 comment \"default/web:http cluster IP\" : goto KUBE-SVC-CDGGSHYLG3RE2FKL"} {
		if !strings.Contains(delta, want) {
			t.Errorf("delta table lacks %q:\n%s", want, delta)
		}
		if strings.Contains(main, want) {
			t.Errorf("main table still has %q:\n%s", want, main)
		}
	}
	if want := b.stale.now().Add(staleChainAge); !res.FollowUpAt.Equal(want) {
		t.Errorf("the change left chains to delete; FollowUpAt = %v, want %v", res.FollowUpAt, want)
	}
	// web's chains: emptied in the main tables, written in the delta ones.
	const svcChain = "chain KUBE-SVC-CDGGSHYLG3RE2FKL {"
	chains := strings.Count(testns.NFT(t, ns, "list", "ruleset"), svcChain)
	if !strings.Contains(main, svcChain) || chains%2 != 0 {
		t.Errorf("the main table lacks the emptied %q (%d in all tables):\n%s", svcChain, chains, main)
	}
	advance(staleChainAge)
	res, err = b.Sync(ctx, web) // the follow-up
	if err != nil || !res.CleanupOnly || res.StaleChainsDeleted == 0 || !res.FollowUpAt.IsZero() {
		t.Fatalf("follow-up: %+v, %v; want only the stale chains deleted, nothing left", res, err)
	}
	if n := strings.Count(testns.NFT(t, ns, "list", "ruleset"), svcChain); n != chains/2 {
		t.Errorf("after the follow-up %d %q, want %d (the delta tables' only)", n, svcChain, chains/2)
	}
	if delta := testns.NFT(t, ns, "list", "table", "ip", "kube-nftproxy-delta"); !strings.Contains(delta, "dnat to 10.244.0.12:8080") {
		t.Errorf("the follow-up folded the delta:\n%s", delta)
	}
	res, err = b.Sync(ctx, web) // fold
	if err != nil || !res.Changed || res.CleanupOnly || res.FollowUpAt.IsZero() {
		t.Fatalf("fold: %+v, %v; want a change leaving the delta's chains to delete", res, err)
	}
	res, err = b.Sync(ctx, web) // too early for them
	if err != nil || res.Changed || res.FollowUpAt.IsZero() {
		t.Errorf("a sync before the stale chains are due: %+v, %v; want nothing sent and the follow-up still asked for", res, err)
	}
	advance(staleChainAge)
	if res, err := b.Sync(ctx, web); err != nil || !res.CleanupOnly {
		t.Fatalf("follow-up after the fold: %+v, %v", res, err)
	}
	if res, err := b.Sync(ctx, web); err != nil || res.Changed || !res.FollowUpAt.IsZero() {
		t.Errorf("a sync with nothing to do sent a transaction or asks for another (%+v, err=%v)", res, err)
	}
	got := testns.NFT(t, ns, "list", "ruleset")
	if testutil.SortedText(got) != testutil.SortedText(Build(web, demoConfig()).String()) {
		t.Errorf("after the fold the kernel differs from a full sync:\n%s\n--- want:\n%s", got, Build(web, demoConfig()).String())
	}
}

// A transaction the kernel refuses changes nothing, says what was refused,
// and makes the next sync a full one that repairs the tables.
func TestKernelFailedSyncIsAtomic(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackend(t, ns, demoConfig())
	advance := fakeClock(b)
	ctx := context.Background()
	if _, err := b.Sync(ctx, demoState()); err != nil {
		t.Fatal(err)
	}
	before := testns.NFT(t, ns, "list", "ruleset")

	// Someone else put an element where our next sync adds one.
	testns.NFT(t, ns, "add", "element", "ip", "kube-nftproxy-delta", "service-ips",
		"{ 10.96.0.99 . tcp . 80 : goto KUBE-MARK-MASQ }")
	next := demoState()
	extra := proxierName("default", "extra", "http")
	next.Services = next.Services.With(extra, &model.ServicePort{Name: extra, Protocol: model.TCP, Port: 80,
		ClusterIPs: []netip.Addr{mustAddr("10.96.0.99")}})
	next.Endpoints = next.Endpoints.With(extra, []model.Endpoint{{Addr: mustAddr("10.244.0.30"), Port: 80, Ready: true, Serving: true}})
	web := proxierName("default", "web", "http")
	next.Endpoints = next.Endpoints.With(web, next.Endpoints.Get(web)[:1]) // a second change in the same sync

	_, err := b.Sync(ctx, next)
	var txErr *nftlib.TxError
	if !errors.As(err, &txErr) || !strings.Contains(txErr.Op, "service-ips") || txErr.Errno != unix.EEXIST {
		t.Fatalf("sync error = %v, want a refused transaction at the service-ips elements with EEXIST", err)
	}
	after := testns.NFT(t, ns, "list", "ruleset")
	after = strings.Replace(after, "elements = { 10.96.0.99 . tcp . 80 : goto KUBE-MARK-MASQ }\n\t", "", 1)
	if testutil.SortedText(after) != testutil.SortedText(before) {
		t.Errorf("a refused transaction changed the kernel:\n%s", after)
	}

	res, err := b.Sync(ctx, next)
	if err != nil || !res.Full {
		t.Fatalf("sync after a failure: full=%v err=%v, want a successful full sync", res.Full, err)
	}
	// The chains the full sync no longer wanted are flushed; the follow-up deletes them.
	advance(staleChainAge)
	if _, err := b.Sync(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(Build(next, demoConfig()).String()) {
		t.Errorf("full sync after a failure did not restore the wanted ruleset:\n%s--- want:\n%s", got, Build(next, demoConfig()).String())
	}
}

// Tables deleted behind our back (nft flush ruleset) are noticed by the
// periodic check and rewritten.
func TestKernelDriftRepaired(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
	ctx := context.Background()
	st := demoState()
	if _, err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Sync(ctx, st); err != nil || res.Full {
		t.Fatalf("check without drift: full=%v err=%v, want no full sync", res.Full, err)
	}
	testns.NFT(t, ns, "flush", "ruleset")
	res, err := b.Sync(ctx, st)
	if err != nil || !res.Full {
		t.Fatalf("after nft flush ruleset: full=%v err=%v, want a full sync", res.Full, err)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(Build(st, demoConfig()).String()) {
		t.Errorf("drift not repaired:\n%s", got)
	}
}

// A sync that changes service ports and folds the delta in the same
// transaction handles each port once (found by the e2e load test: rules
// were added twice and stale chains deleted twice).
func TestKernelFoldWithChanges(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), Strategy: Strategy{FoldAt: 1}})
	advance := fakeClock(b)
	ctx := context.Background()
	st := demoState()
	if _, err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	web, dns := proxierName("default", "web", "http"), proxierName("default", "dns-like", "dns")
	next := demoState()
	next.Endpoints.Get(web)[0].Port = 9090
	next.Endpoints.Get(dns)[0].Port = 9053
	for i := 0; i < 3; i++ { // change (and fold), delete leftovers, nothing
		if _, err := b.Sync(ctx, next); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		advance(staleChainAge)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(Build(next, demoConfig()).String()) {
		t.Errorf("kernel differs from a full sync after a folding change:\n%s", got)
	}
}

// With the real clock: the chains a removed Service leaves are deleted by
// the first sync at or after FollowUpAt (about staleChainAge later), not
// before it, and that transaction succeeds (on kernels before 6.2 too,
// which release such chains a little after the commit).
func TestKernelStaleChainsDeletedOnTime(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackend(t, ns, demoConfig())
	ctx := context.Background()
	if _, err := b.Sync(ctx, demoState()); err != nil {
		t.Fatal(err)
	}
	gone := demoState()
	web := proxierName("default", "web", "http")
	gone.Services = gone.Services.Without(web)
	gone.Endpoints = gone.Endpoints.Without(web)
	removed := time.Now()
	res, err := b.Sync(ctx, gone)
	if err != nil || res.FollowUpAt.IsZero() {
		t.Fatalf("removing web: %+v, %v; want chains left to delete later", res, err)
	}
	const comment = `comment "default/web:http"`
	if !strings.Contains(testns.NFT(t, ns, "list", "ruleset"), comment) {
		t.Fatal("web's emptied chains are not in the ruleset; the test would prove nothing")
	}
	deadline := removed.Add(5 * time.Second)
	for {
		now := time.Now()
		res, err := b.Sync(ctx, gone)
		if err != nil {
			t.Fatalf("sync %v after the removal: %v", now.Sub(removed), err)
		}
		if res.CleanupOnly {
			if now.Before(removed.Add(staleChainAge)) {
				t.Errorf("stale chains deleted %v after the removal, before %v", now.Sub(removed), staleChainAge)
			}
			break
		}
		if res.Changed {
			t.Fatalf("a sync with nothing to do but wait sent a transaction: %+v", res)
		}
		if now.After(deadline) {
			t.Fatalf("stale chains still not deleted %v after the removal", now.Sub(removed))
		}
		time.Sleep(50 * time.Millisecond) // the loop's MinSyncPeriod, not synchronisation
	}
	if rs := testns.NFT(t, ns, "list", "ruleset"); strings.Contains(rs, comment) {
		t.Errorf("web's chains remain after the follow-up:\n%s", rs)
	}
}

// A State whose Changes follow the one applied last is synced by looking at
// the service ports it names alone (a change it does not name is not seen:
// the proof that nothing else was compared); a State that does not follow
// (a State generation skipped, another lineage) is compared whole.
func TestKernelStateChanges(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackend(t, ns, demoConfig())
	ctx := context.Background()
	lineage := &model.Lineage{}
	web, dns := proxierName("default", "web", "http"), proxierName("default", "dns-like", "dns")
	state := func(gen uint64, webEP, dnsEP string, changed ...model.ServicePortName) *model.State {
		st := demoState()
		st.Endpoints.Get(web)[0].Addr = mustAddr(webEP)
		st.Endpoints.Get(dns)[0].Addr = mustAddr(dnsEP)
		st.Changes = model.StateChanges{Lineage: lineage, Gen: gen, Ports: changed, NodeChanged: gen == 1}
		return st
	}
	sync := func(st *model.State) {
		t.Helper()
		if res, err := b.Sync(ctx, st); err != nil || res.Full != (st.Changes.Gen == 1) {
			t.Fatalf("sync of State generation %d: %+v, %v", st.Changes.Gen, res, err)
		}
	}
	expect := func(step string, want, unwanted []string) {
		t.Helper()
		got := testns.NFT(t, ns, "list", "ruleset")
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the ruleset lacks %q", step, w)
			}
		}
		for _, u := range unwanted {
			if strings.Contains(got, u) {
				t.Errorf("%s: the ruleset still has %q", step, u)
			}
		}
	}
	sync(state(1, "10.244.0.20", "10.244.0.30"))
	// web listed twice, as a Builder lists a Service refreshed twice.
	sync(state(2, "10.244.0.21", "10.244.0.31", web, web))
	expect("changes naming web", []string{"dnat to 10.244.0.21:8080", "dnat to 10.244.0.30:5353"},
		[]string{"dnat to 10.244.0.20:8080", "dnat to 10.244.0.31:5353"})
	sync(state(4, "10.244.0.21", "10.244.0.31"))
	expect("State generation 3 skipped", []string{"dnat to 10.244.0.31:5353"}, []string{"dnat to 10.244.0.30:5353"})
	gone := state(5, "10.244.0.21", "10.244.0.31", dns)
	gone.Services = gone.Services.Without(dns)
	gone.Endpoints = gone.Endpoints.Without(dns)
	sync(gone)
	expect("changes naming a removed Service", nil, []string{"dnat to 10.244.0.31:5353", "default/dns-like:dns cluster IP"})
}

// A large full sync is followed by a transaction that changes nothing (see
// settle): the generation moves by two, the drift check counts both as
// ours (nothing read back), and the settle chain is gone.
func TestKernelFullSyncSettles(t *testing.T) {
	for _, monitor := range []bool{false, true} {
		t.Run(fmt.Sprintf("monitor=%v", monitor), func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
			if !monitor {
				b.kern().noWatch = true // checks compare generations only
			}
			ctx := context.Background()
			st := scaleState(400, 10)
			// The first check after the first sync reads everything back
			// when there is no monitor; a full sync from there is checked
			// by generation alone.
			for range 2 {
				if _, err := b.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			b.ForceFull()
			before, err := b.kern().Generation()
			if err != nil {
				t.Fatal(err)
			}
			res, err := b.Sync(ctx, st)
			if err != nil || !res.Full {
				t.Fatalf("forced full sync: full=%v err=%v", res.Full, err)
			}
			if res.Messages < settleFrom {
				t.Fatalf("full sync of %d messages: too small to settle (%d)", res.Messages, settleFrom)
			}
			after, err := b.kern().Generation()
			if err != nil {
				t.Fatal(err)
			}
			if after != before+2 {
				t.Errorf("generation moved by %d, want 2 (the full sync and the settle)", after-before)
			}
			reads := b.kern().reads
			if res, err := b.Sync(ctx, st); err != nil || res.Full || res.Changed {
				t.Fatalf("check after the settle: full=%v changed=%v err=%v, want nothing to do", res.Full, res.Changed, err)
			}
			if b.kern().reads != reads {
				t.Errorf("the check after the settle read the kernel %d times: the settle was taken for drift", b.kern().reads-reads)
			}
			if out := testns.NFT(t, ns, "list", "table", "ip", DefaultTableName); strings.Contains(out, settleChain) {
				t.Errorf("the settle chain is left:\n%s", out)
			}
		})
	}
}

// countingKernel is the kernel tests' Kernel, counting the transactions
// it committed, the reads of what the kernel holds (a full sync's
// metadata, a drift check's read-back) and, of those, the tables a drift
// check compared (readBacks: a scope that cannot be compared alone counts
// once, as the whole table). The Backend keeps no such count: it would
// report it nowhere, and every read-back crosses this boundary. drift
// collects the differences the Backend reported (see openTestBackendWith).
type countingKernel struct {
	*nftlib.Kernel
	commits, reads, readBacks int
	drift                     []string
	// noWatch makes Watch fail: the change monitor cannot be opened.
	noWatch bool
}

func (k *countingKernel) Watch(tables []nftlib.TableRef, rcvBuf int, onMark func()) error {
	if k.noWatch {
		return errors.New("no change monitor in this test")
	}
	return k.Kernel.Watch(tables, rcvBuf, onMark)
}

func (k *countingKernel) CommitTx(tx nftlib.KernelTx) error {
	err := k.Kernel.CommitTx(tx)
	if err == nil {
		k.commits++
	}
	return err
}

func (k *countingKernel) HasTables(f nftlib.Family, names []string) (map[string]bool, error) {
	k.reads++
	return k.Kernel.HasTables(f, names)
}

func (k *countingKernel) ReadFamily(f nftlib.Family, names []string, expect map[string][]string) (map[string]*nftlib.KernelTable, error) {
	k.reads++
	return k.Kernel.ReadFamily(f, names, expect)
}

func (k *countingKernel) TableDrift(t *nftlib.Table, kt *nftlib.KernelTable, stale []string) ([]string, error) {
	k.reads++
	k.readBacks++
	return k.Kernel.TableDrift(t, kt, stale)
}

func (k *countingKernel) ScopedDrift(t *nftlib.Table, scope nftlib.ChangeScope, stale []string) ([]string, []*nftlib.Tx, error) {
	k.reads++
	diffs, repair, err := k.Kernel.ScopedDrift(t, scope, stale)
	if err == nil {
		k.readBacks++
	}
	return diffs, repair, err
}

// kern is b's kernel (the kernel tests open one).
func (b *Backend) kern() *countingKernel { return b.k.(*countingKernel) }
