package nft

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// foreignCase adds another process's objects to our ip table with nft.
type foreignCase struct {
	name string
	nft  []string // nft commands, one string each, run in order
	want string   // a substring of one reported difference
	// inPlace: the change monitor names every object it touches, which
	// a repair in place rewrites or deletes (not a full sync).
	inPlace bool
	// optional: skip where the kernel cannot hold the object at all.
	optional bool
}

func foreignCases() []foreignCase {
	const tbl = "ip " + DefaultTableName + " "
	return []foreignCase{
		{name: "rule with an anonymous set", want: "chain KUBE-SERVICES: rule 3 (handle", inPlace: true,
			nft: []string{"add rule " + tbl + "KUBE-SERVICES ip saddr { 1.2.3.4, 5.6.7.8 } counter"}},
		{name: "rule with an anonymous verdict map", want: "chain KUBE-SERVICES: rule 1 (handle", inPlace: true,
			nft: []string{"insert rule " + tbl + "KUBE-SERVICES ip saddr vmap { 1.2.3.4 : drop, 5.6.7.8 : accept }"}},
		{name: "rule with an anonymous chain", want: "chain KUBE-SERVICES: rule 3 (handle", inPlace: true,
			nft: []string{"add rule " + tbl + "KUBE-SERVICES ip saddr 1.2.3.4 jump { counter; }"}},
		{name: "named set and a rule using it", want: "set foreign: not ours", inPlace: true,
			nft: []string{"add set " + tbl + "foreign { type ipv4_addr; elements = { 1.2.3.4 }; }",
				"add rule " + tbl + "KUBE-SERVICES ip saddr @foreign drop"}},
		{name: "counter used by a rule", want: "counter fc: not ours", inPlace: true,
			nft: []string{"add counter " + tbl + "fc", "add rule " + tbl + "KUBE-SERVICES counter name fc"}},
		{name: "quota", want: "quota fq: not ours", inPlace: true, nft: []string{"add quota " + tbl + "fq { over 25 mbytes }"}},
		{name: "ct helper", want: "ct helper fh: not ours", inPlace: true,
			nft: []string{`add ct helper ` + tbl + `fh { type "ftp" protocol tcp; }`}},
		{name: "limit, ct timeout, ct expectation and synproxy", want: "synproxy fs: not ours", inPlace: true,
			nft: []string{"add limit " + tbl + "fl { rate 10/second }",
				"add ct timeout " + tbl + "fto { protocol tcp; policy = { established: 100 }; }",
				"add ct expectation " + tbl + "fe { protocol tcp; dport 21; timeout 1s; size 10; l3proto ip; }",
				"add synproxy " + tbl + "fs { mss 1460; wscale 7; }"}},
		{name: "map of counters", want: "counter fc: not ours", inPlace: true,
			nft: []string{"add counter " + tbl + "fc", `add map ` + tbl + `fcm { type ipv4_addr : counter; elements = { 1.2.3.4 : "fc" }; }`}},
		{name: "flowtable used by a rule", want: "flowtable ff: not ours", inPlace: true, optional: true,
			nft: []string{"add flowtable " + tbl + "ff { hook ingress priority 0; devices = { lo }; }",
				"add chain " + tbl + "offload { type filter hook forward priority 0; }",
				"add rule " + tbl + "offload ip protocol tcp flow add @ff"}},
	}
}

// injectForeign runs a case's nft commands; an optional case is skipped
// when the kernel cannot hold its objects.
func injectForeign(t *testing.T, ns string, tc foreignCase) {
	t.Helper()
	for _, c := range tc.nft {
		if !tc.optional {
			testns.NFT(t, ns, c)
			continue
		}
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", c).CombinedOutput(); err != nil {
			t.Skipf("this kernel cannot hold it (nft %s: %v: %s)", c, err, out)
		}
	}
}

// syncUntilRepaired syncs st, which repairs the table.
func syncUntilRepaired(t *testing.T, b *Backend, st *model.State) proxier.SyncResult {
	t.Helper()
	res, err := b.Sync(context.Background(), st)
	if err != nil {
		t.Fatalf("repairing sync: %v", err)
	}
	return res
}

// Whatever another process adds to our table is found by the drift check
// and removed by the repair: in place when the change monitor names all
// it touched, else by a full sync. Afterwards the kernel holds exactly our
// render, the check is clean and a Service change syncs.
func TestKernelForeignObjectsRepaired(t *testing.T) {
	for _, tc := range foreignCases() {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
			ctx := context.Background()
			st := demoState()
			for i := 0; i < 2; i++ { // program, then check clean
				if _, err := b.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			injectForeign(t, ns, tc)
			if res := syncUntilRepaired(t, b, st); res.Full == tc.inPlace {
				t.Errorf("the repair was a full sync: %v, want %v", res.Full, !tc.inPlace)
			}
			found := b.kern().drift
			t.Logf("reported: %q", found)
			if !containsSub(found, tc.want) {
				t.Errorf("reported %q, want one containing %q", found, tc.want)
			}
			assertKernelIsRender(t, ns, st)
			b.kern().drift = nil
			if _, err := b.Sync(ctx, st); err != nil || len(b.kern().drift) > 0 {
				t.Errorf("check after the repair: err=%v drift=%q", err, b.kern().drift)
			}
			next := shallowCopy(st)
			web := proxierName("default", "web", "http")
			next.Endpoints = next.Endpoints.With(web, next.Endpoints.Get(web)[1:])
			if _, err := b.Sync(ctx, next); err != nil {
				t.Fatalf("a Service change after the repair: %v", err)
			}
			// The follow-up sync deletes the chains the repair flushed.
			b.stale.now = func() time.Time { return time.Now().Add(2 * staleChainAge) }
			if _, err := b.Sync(ctx, next); err != nil {
				t.Fatalf("the follow-up sync: %v", err)
			}
			if d := readBackDrift(t, b, b.appliedTables(tableIDs())); len(d) > 0 {
				t.Errorf("the kernel differs from what the Service change applied: %q", d)
			}
		})
	}
}

// A restarted proxy (a new Backend, first sync full) onto a table with
// foreign objects programs its rules in its first transaction.
func TestKernelForeignObjectsAtStartup(t *testing.T) {
	for _, tc := range foreignCases() {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			st := demoState()
			if _, err := openTestBackend(t, ns, demoConfig()).Sync(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			injectForeign(t, ns, tc)
			b := openTestBackend(t, ns, demoConfig())
			syncUntilRepaired(t, b, st)
			assertKernelIsRender(t, ns, st)
			// The follow-up sync deletes the chains the first one flushed.
			b.stale.now = func() time.Time { return time.Now().Add(2 * staleChainAge) }
			if _, err := b.Sync(context.Background(), st); err != nil {
				t.Fatalf("the follow-up sync: %v", err)
			}
			if strings.Contains(testns.NFT(t, ns, "list", "ruleset"), "__") {
				t.Errorf("an anonymous object survived the restart")
			}
		})
	}
}
