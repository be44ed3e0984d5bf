package nft

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// These tests run Backend.Sync against FakeKernel: no privileges needed.
// The kernel tests (TestKernel*) prove the same behaviour on the kernel.

// fakeBackend returns a Backend on a FakeKernel, with its stale-chain
// clock under the test's control.
func fakeBackend(t testing.TB, cfg BackendConfig) (*Backend, nftlib.FakeKernel, func(time.Duration)) {
	t.Helper()
	if cfg.Rules.TableName == "" {
		cfg.Rules = demoConfig()
	}
	k := nftlib.NewFakeKernel()
	b, err := NewBackend(k, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b, k, fakeClock(b)
}

// tinyState is one IPv4 Service port per name with its endpoint (none for
// ""), naming no changes (see withChanges).
func tinyState(eps map[string]string) *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	i := 0
	for _, name := range sortedKeys(eps) {
		i++
		n := proxierName("ns", name, "p")
		st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.TCP, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})}})
		if eps[name] != "" {
			st.Endpoints = st.Endpoints.With(n, []model.Endpoint{{Addr: mustAddr(eps[name]), Port: 8080, NodeName: "node-1", Ready: true, Serving: true}})
		}
	}
	return st
}

func sortedKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// fakeStep is one sync of a scenario and what it must do.
type fakeStep struct {
	what string
	st   *model.State  // nil: the State of the step before
	wait time.Duration // the stale-chain clock moves on before the sync
	// The sync's result: full, a transaction sent (tx, when not "", is
	// the whole of it, as nft commands), only stale chains deleted.
	full, changed, cleanupOnly bool
	tx                         string
	followUp                   bool     // it asks for a follow-up sync
	delta                      []string // the service ports in the delta tables after it
}

// runFakeSteps runs a scenario; at its end the fake kernel must hold
// what a full sync of the last State writes (the delta folded, stale
// chains deleted) when the scenario ends with an idle sync and its
// follow-up.
func runFakeSteps(t *testing.T, b *Backend, k nftlib.FakeKernel, advance func(time.Duration), steps []fakeStep) *model.State {
	t.Helper()
	var st *model.State
	for _, s := range steps {
		if s.st != nil {
			st = s.st
		}
		advance(s.wait)
		commits := k.Commits()
		res, err := b.Sync(context.Background(), st)
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		tx := ""
		if k.Commits() > commits {
			tx = k.Journal()[len(k.Journal())-1]
		}
		if os.Getenv("KNP_FAKE_PRINT") != "" {
			t.Logf("%s:\n%s", s.what, tx)
		}
		if res.Full != s.full || res.Changed != s.changed || res.CleanupOnly != s.cleanupOnly || !res.FollowUpAt.IsZero() != s.followUp {
			t.Errorf("%s: full=%v changed=%v cleanupOnly=%v followUp=%v, want %v %v %v %v", s.what,
				res.Full, res.Changed, res.CleanupOnly, !res.FollowUpAt.IsZero(), s.full, s.changed, s.cleanupOnly, s.followUp)
		}
		if s.tx != "" && strings.TrimSpace(tx) != strings.TrimSpace(s.tx) {
			t.Errorf("%s: transaction\n%s\nwant\n%s", s.what, tx, s.tx)
		}
		var delta []string
		for name := range b.inDelta {
			delta = append(delta, name.Name)
		}
		slices.Sort(delta)
		if !slices.Equal(delta, s.delta) {
			t.Errorf("%s: delta holds %v, want %v", s.what, delta, s.delta)
		}
	}
	return st
}

// holdsFullSync checks that the fake holds what a full sync of st writes.
func holdsFullSync(t *testing.T, k nftlib.FakeKernel, st *model.State, cfg Config) {
	t.Helper()
	if got, want := testutil.SortedText(k.String()), testutil.SortedText(Build(st, cfg).String()); got != want {
		t.Errorf("the kernel holds\n%s\nwant what a full sync writes\n%s", k.String(), Build(st, cfg).String())
	}
}

// withChanges makes st State generation gen of lin, changed naming its changes.
func withChanges(st *model.State, lin *model.Lineage, gen uint64, changed ...string) *model.State {
	st.Changes = model.StateChanges{Lineage: lin, Gen: gen}
	for _, c := range changed {
		st.Changes.Ports = append(st.Changes.Ports, proxierName("ns", c, "p"))
	}
	return st
}

// A changed service port moves to the delta table; the chains it leaves
// in the main table are deleted by a follow-up staleChainAge later, which
// does nothing else; an idle sync folds the delta back, and its follow-up
// deletes what the fold left, after which the kernel holds what a full
// sync writes. Each transaction is given whole.
func TestBackendFakeDeltaFoldStale(t *testing.T) {
	lin := &model.Lineage{}
	two := func(a, b string) map[string]string { return map[string]string{"a": a, "b": b} }
	steps := []fakeStep{
		{what: "first sync", st: withChanges(tinyState(two("10.244.0.1", "10.244.0.9")), lin, 1), full: true, changed: true},
		{what: "a's endpoint moves", st: withChanges(tinyState(two("10.244.0.2", "10.244.0.9")), lin, 2, "a"), changed: true, followUp: true, delta: []string{"a"},
			tx: `
delete element ip kube-nftproxy service-ips { 10.96.0.1 . tcp . 80 }
flush chain ip kube-nftproxy KUBE-SEP-7FDJAXXCBH7RHJZM
flush chain ip kube-nftproxy KUBE-SVC-ZOE7WQMSI2YE7I74
add chain ip kube-nftproxy-delta KUBE-SEP-5BU2GB6VA53DTBQD
add chain ip kube-nftproxy-delta KUBE-SVC-ZOE7WQMSI2YE7I74
add rule ip kube-nftproxy-delta KUBE-SEP-5BU2GB6VA53DTBQD ip saddr 10.244.0.2 jump KUBE-MARK-MASQ
add rule ip kube-nftproxy-delta KUBE-SEP-5BU2GB6VA53DTBQD meta l4proto tcp dnat to 10.244.0.2:8080
add rule ip kube-nftproxy-delta KUBE-SVC-ZOE7WQMSI2YE7I74 ip daddr 10.96.0.1 th dport 80 ip saddr != 10.244.0.0/16 jump KUBE-MARK-MASQ comment "ns/a:p cluster IP"
add rule ip kube-nftproxy-delta KUBE-SVC-ZOE7WQMSI2YE7I74 goto KUBE-SEP-5BU2GB6VA53DTBQD comment "ns/a:p -> 10.244.0.2:8080"
add element ip kube-nftproxy-delta service-ips { 10.96.0.1 . tcp . 80 comment "ns/a:p cluster IP" : goto KUBE-SVC-ZOE7WQMSI2YE7I74 }`},
		{what: "follow-up deletes the emptied chains, no fold", wait: staleChainAge, changed: true, cleanupOnly: true, delta: []string{"a"},
			tx: `
delete chain ip kube-nftproxy KUBE-SEP-7FDJAXXCBH7RHJZM
delete chain ip kube-nftproxy KUBE-SVC-ZOE7WQMSI2YE7I74`},
		{what: "idle sync folds", wait: time.Minute, changed: true, followUp: true,
			tx: `
add chain ip kube-nftproxy KUBE-SEP-5BU2GB6VA53DTBQD
add chain ip kube-nftproxy KUBE-SVC-ZOE7WQMSI2YE7I74
add rule ip kube-nftproxy KUBE-SEP-5BU2GB6VA53DTBQD ip saddr 10.244.0.2 jump KUBE-MARK-MASQ
add rule ip kube-nftproxy KUBE-SEP-5BU2GB6VA53DTBQD meta l4proto tcp dnat to 10.244.0.2:8080
add rule ip kube-nftproxy KUBE-SVC-ZOE7WQMSI2YE7I74 ip daddr 10.96.0.1 th dport 80 ip saddr != 10.244.0.0/16 jump KUBE-MARK-MASQ comment "ns/a:p cluster IP"
add rule ip kube-nftproxy KUBE-SVC-ZOE7WQMSI2YE7I74 goto KUBE-SEP-5BU2GB6VA53DTBQD comment "ns/a:p -> 10.244.0.2:8080"
add element ip kube-nftproxy service-ips { 10.96.0.1 . tcp . 80 comment "ns/a:p cluster IP" : goto KUBE-SVC-ZOE7WQMSI2YE7I74 }
delete element ip kube-nftproxy-delta service-ips { 10.96.0.1 . tcp . 80 }
flush chain ip kube-nftproxy-delta KUBE-SEP-5BU2GB6VA53DTBQD
flush chain ip kube-nftproxy-delta KUBE-SVC-ZOE7WQMSI2YE7I74`},
		{what: "its follow-up", wait: staleChainAge, changed: true, cleanupOnly: true,
			tx: `
delete chain ip kube-nftproxy-delta KUBE-SEP-5BU2GB6VA53DTBQD
delete chain ip kube-nftproxy-delta KUBE-SVC-ZOE7WQMSI2YE7I74`},
		{what: "nothing left to do", wait: time.Minute},
	}
	b, k, advance := fakeBackend(t, BackendConfig{})
	st := runFakeSteps(t, b, k, advance, steps)
	holdsFullSync(t, k, st, demoConfig())
}

// withAffinityOn gives the named service ports session affinity.
func withAffinityOn(st *model.State, names ...string) *model.State {
	for _, n := range names {
		name := proxierName("ns", n, "p")
		svc := *st.Services.Get(name)
		svc.AffinityTimeout = 3 * time.Hour
		st.Services = st.Services.With(name, &svc)
	}
	return st
}

// Scenarios of delta, fold and stale chains, each ending with the kernel
// holding what a full sync of the last State writes.
func TestBackendFakeScenarios(t *testing.T) {
	lin := &model.Lineage{}
	eps := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	base := eps("a", "10.244.0.1", "b", "10.244.0.9")
	moved := eps("a", "10.244.0.2", "b", "10.244.0.9")
	idleAndCleanup := []fakeStep{
		{what: "idle sync folds", wait: time.Minute, changed: true, followUp: true},
		{what: "its follow-up deletes what the fold emptied", wait: staleChainAge, changed: true, cleanupOnly: true},
	}
	tests := []struct {
		name   string
		foldAt int
		steps  []fakeStep
	}{
		{name: "a periodic sync before the follow-up folds the delta", steps: []fakeStep{
			{what: "first", st: withChanges(tinyState(base), lin, 1), full: true, changed: true},
			{what: "a moves", st: withChanges(tinyState(moved), lin, 2, "a"), changed: true, followUp: true, delta: []string{"a"}},
			{what: "periodic sync folds, keeps the chains it wants again", wait: staleChainAge / 2, changed: true, followUp: true},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true},
		}},
		{name: "a removed service port leaves the main table; an added one goes to the delta", steps: append([]fakeStep{
			{what: "first", st: withChanges(tinyState(base), lin, 1), full: true, changed: true},
			{what: "b removed", st: withChanges(tinyState(eps("a", "10.244.0.1")), lin, 2, "b"), changed: true, followUp: true, tx: `
delete element ip kube-nftproxy service-ips { 10.96.0.2 . tcp . 80 }
delete element ip kube-nftproxy cluster-ips { 10.96.0.2 }
flush chain ip kube-nftproxy KUBE-SEP-Z5OOVPMZYYAASIAC
flush chain ip kube-nftproxy KUBE-SVC-M7WRKUUGGLVBVVX5`},
			{what: "c added", st: withChanges(tinyState(eps("a", "10.244.0.1", "c", "10.244.0.3")), lin, 3, "c"), changed: true, followUp: true, delta: []string{"c"}},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true, delta: []string{"c"}},
		}, idleAndCleanup...)},
		{name: "session affinity stays in the affinity table", steps: []fakeStep{
			{what: "first", st: withAffinityOn(withChanges(tinyState(base), lin, 1), "a"), full: true, changed: true},
			{what: "a moves", st: withAffinityOn(withChanges(tinyState(moved), lin, 2, "a"), "a"), changed: true, followUp: true},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true},
			{what: "idle: nothing to fold", wait: time.Minute},
		}},
		{name: "the delta folds with a change once it outgrows FoldAt", foldAt: 1, steps: []fakeStep{
			{what: "first", st: withChanges(tinyState(base), lin, 1), full: true, changed: true},
			{what: "a moves", st: withChanges(tinyState(moved), lin, 2, "a"), changed: true, followUp: true, delta: []string{"a"}},
			{what: "b moves too: two over one, fold", st: withChanges(tinyState(eps("a", "10.244.0.2", "b", "10.244.0.8")), lin, 3, "b"), changed: true, followUp: true},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true},
		}},
		{name: "States without a delta are compared service port by service port", steps: append([]fakeStep{
			{what: "first", st: tinyState(base), full: true, changed: true},
			{what: "the same values in new objects", st: tinyState(base)},
			{what: "a moves", st: tinyState(moved), changed: true, followUp: true, delta: []string{"a"}},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true, delta: []string{"a"}},
		}, idleAndCleanup...)},
		{name: "a change undone before the fold", steps: append([]fakeStep{
			{what: "first", st: withChanges(tinyState(base), lin, 1), full: true, changed: true},
			{what: "a moves", st: withChanges(tinyState(moved), lin, 2, "a"), changed: true, followUp: true, delta: []string{"a"}},
			{what: "a moves back", st: withChanges(tinyState(base), lin, 3, "a"), changed: true, followUp: true, delta: []string{"a"}},
			{what: "follow-up", wait: staleChainAge, changed: true, cleanupOnly: true, delta: []string{"a"}},
		}, idleAndCleanup...)},
		{name: "a new node description rewrites everything", steps: []fakeStep{
			{what: "first", st: withChanges(tinyState(base), lin, 1), full: true, changed: true},
			{what: "a moves", st: withChanges(tinyState(moved), lin, 2, "a"), changed: true, followUp: true, delta: []string{"a"}},
			{what: "new node", st: func() *model.State {
				st := withChanges(tinyState(moved), lin, 3)
				st.Changes.NodeChanged = true
				st.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}
				return st
			}(), full: true, changed: true, followUp: true},
			{what: "follow-up deletes the chains the full sync emptied", wait: staleChainAge, changed: true, cleanupOnly: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, k, advance := fakeBackend(t, BackendConfig{Strategy: Strategy{FoldAt: tt.foldAt}})
			st := runFakeSteps(t, b, k, advance, tt.steps)
			holdsFullSync(t, k, st, demoConfig())
		})
	}
}

// A full sync into the fake holds what Build renders, for every golden
// case (TestKernelListingMatchesRender proves it for the kernel).
func TestBackendFakeMatchesBuild(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			b, k, _ := fakeBackend(t, BackendConfig{Rules: tc.cfg})
			res, err := b.Sync(context.Background(), tc.st)
			if err != nil || !res.Full {
				t.Fatalf("first sync: full=%v err=%v", res.Full, err)
			}
			holdsFullSync(t, k, tc.st, tc.cfg)
		})
	}
}

// A refused transaction changes nothing: a refused change leaves the
// applied tables as they were and the next sync repairs with a full one;
// a refused full sync makes the next one replace the table it names, or
// all of them when it names none of ours.
func TestBackendFakeRefused(t *testing.T) {
	lin := &model.Lineage{}
	base := map[string]string{"a": "10.244.0.1", "b": "10.244.0.9"}
	moved := map[string]string{"a": "10.244.0.2", "b": "10.244.0.9"}
	refuse := func(prefix string) func(string) error {
		return func(cmd string) error {
			if strings.HasPrefix(cmd, prefix) {
				return syscall.EBUSY
			}
			return nil
		}
	}
	tests := []struct {
		name    string
		first   bool   // the first, full, sync is refused
		refuse  string // commands starting so are refused
		replace []string
	}{
		{name: "a change", refuse: "add element ip kube-nftproxy-delta"},
		{name: "a full sync, at a table of ours", first: true, refuse: "flush table ip kube-nftproxy-delta", replace: []string{"ip kube-nftproxy-delta"}},
		{name: "a full sync, at another table of ours", first: true, refuse: "add set ip6 kube-nftproxy-affinity", replace: []string{"ip6 kube-nftproxy-affinity"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, k, advance := fakeBackend(t, BackendConfig{})
			ctx := context.Background()
			if _, err := b.Sync(ctx, withChanges(tinyState(base), lin, 1)); err != nil {
				t.Fatal(err)
			}
			st := withChanges(tinyState(moved), lin, 2, "a")
			if tt.first {
				b.ForceFull()
			}
			before := k.String()
			k.SetRefuse(refuse(tt.refuse))
			_, err := b.Sync(ctx, st)
			var txErr *nftlib.TxError
			if !errors.As(err, &txErr) || txErr.Errno != syscall.EBUSY {
				t.Fatalf("refused sync: err = %v, want a TxError with EBUSY", err)
			}
			if k.String() != before {
				t.Errorf("a refused transaction changed the kernel")
			}
			k.SetRefuse(nil)
			res, err := b.Sync(ctx, st)
			if err != nil || !res.Full {
				t.Fatalf("the sync after a refusal: full=%v err=%v, want a full one", res.Full, err)
			}
			tx := k.Journal()[len(k.Journal())-1]
			for _, table := range tt.replace {
				if !strings.Contains(tx, "delete table "+table+"\nadd table "+table+" ") {
					t.Errorf("the sync after the refusal does not replace %s:\n%s", table, tx)
				}
			}
			if n := strings.Count(tx, "delete table"); n != len(tt.replace) {
				t.Errorf("the sync after the refusal deletes %d tables, want %d", n, len(tt.replace))
			}
			followUp(t, b, advance, st)
			holdsFullSync(t, k, st, demoConfig())
		})
	}
}

// Another process's change to our tables is found by the drift check,
// reported, and repaired by a full sync; with no change, the check costs
// a generation read.
func TestBackendFakeDrift(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(tx nftlib.KernelTx)
		drift  bool
	}{
		{name: "nothing changed"},
		{name: "a chain flushed", tamper: func(tx nftlib.KernelTx) { tx.FlushChain(nftlib.IPv4, DefaultTableName, chainServices) }, drift: true},
		{name: "a rule added", tamper: func(tx nftlib.KernelTx) {
			tx.AddRule(nftlib.IPv6, DefaultTableName+deltaSuffix, chainServices, nftlib.R(nftlib.Verdict{Kind: nftlib.Drop}))
		}, drift: true},
		{name: "a chain added", tamper: func(tx nftlib.KernelTx) {
			tx.AddChains(nftlib.IPv4, DefaultTableName+affinitySuffix, []*nftlib.Chain{{Name: "rogue"}})
		}, drift: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var found []string
			b, k, advance := fakeBackend(t, BackendConfig{CheckEvery: time.Nanosecond,
				OnDrift: func(table string, diffs []string) { found = append(found, diffs...) }})
			ctx := context.Background()
			st := tinyState(map[string]string{"a": "10.244.0.1"})
			for range 2 { // the second sync verifies the generation
				if _, err := b.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			if tt.tamper != nil {
				if err := k.Commit(tt.tamper); err != nil {
					t.Fatal(err)
				}
			}
			reads := k.Reads()
			res, err := b.Sync(ctx, st)
			if err != nil {
				t.Fatal(err)
			}
			if res.Full != tt.drift || (len(found) > 0) != tt.drift {
				t.Errorf("full=%v drift reported %v, want %v", res.Full, found, tt.drift)
			}
			if !tt.drift && k.Reads() != reads {
				t.Errorf("an unchanged generation read %d tables back", k.Reads()-reads)
			}
			followUp(t, b, advance, st)
			holdsFullSync(t, k, st, demoConfig())
		})
	}
}

// Cleanup deletes our tables in one transaction, and only when there are.
func TestBackendFakeCleanup(t *testing.T) {
	b, k, _ := fakeBackend(t, BackendConfig{})
	ctx := context.Background()
	if removed, err := b.Cleanup(ctx); removed || err != nil {
		t.Fatalf("cleanup of nothing: removed=%v err=%v", removed, err)
	}
	st := tinyState(map[string]string{"a": "10.244.0.1"})
	if _, err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	commits := k.Commits()
	if removed, err := b.Cleanup(ctx); !removed || err != nil || k.Commits() != commits+1 {
		t.Fatalf("cleanup: removed=%v err=%v transactions=%d", removed, err, k.Commits()-commits)
	}
	if k.String() != "" {
		t.Errorf("after cleanup the kernel holds\n%s", k.String())
	}
	if res, err := b.Sync(ctx, st); err != nil || !res.Full {
		t.Errorf("the sync after a cleanup: full=%v err=%v, want a full one", res.Full, err)
	}
}

// followUp runs the follow-up sync that deletes the stale chains.
func followUp(t *testing.T, b *Backend, advance func(time.Duration), st *model.State) {
	t.Helper()
	advance(staleChainAge)
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatalf("follow-up: %v", err)
	}
}
