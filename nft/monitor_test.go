package nft

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// monitorOf is b's change monitor; the test fails without one.
func monitorOf(t testing.TB, b *Backend) nftlib.Watcher {
	t.Helper()
	mon := b.k.Monitor()
	if mon == nil {
		t.Fatal("no change monitor")
	}
	return mon
}

// checkedSync syncs st with a drift check and returns how many tables the
// check read back; it fails on drift, errors or a full sync.
func checkedSync(t *testing.T, b *Backend, st *model.State, what string) int {
	t.Helper()
	k := b.kern()
	k.drift = nil
	before := k.readBacks
	res, err := b.Sync(context.Background(), st)
	if err != nil || res.Full || len(k.drift) > 0 {
		t.Fatalf("%s: full=%v err=%v drift=%q", what, res.Full, err, k.drift)
	}
	return k.readBacks - before
}

// Events the monitor lost (it marks every table, as after an overflow of
// its receive buffer: nftlib's TestKernelMonitorOverflowMarksAll) make
// the next check read every table back; the one after, with nothing
// lost, reads none.
func TestKernelCheckAfterLostEvents(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
	st := demoState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	checkedSync(t, b, st, "first check")
	mon := monitorOf(t, b)
	mon.MarkAll()
	if n := checkedSync(t, b, st, "after events were lost"); n != len(tableIDs()) {
		t.Errorf("after events were lost the check read %d tables back, want all %d", n, len(tableIDs()))
	}
	if n := checkedSync(t, b, st, "nothing lost"); n != 0 {
		t.Errorf("the check read %d tables back, want 0", n)
	}
}

// Without a monitor (it could not be opened), a check reads every table
// back when another process committed, as before the monitor.
func TestKernelCheckWithoutMonitor(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
	b.kern().noWatch = true
	st := demoState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	all := len(tableIDs())
	if n := checkedSync(t, b, st, "first check"); n != all {
		t.Errorf("first check read %d tables, want %d", n, all)
	}
	if n := checkedSync(t, b, st, "nothing changed"); n != 0 {
		t.Errorf("unchanged generation: read %d tables, want 0", n)
	}
	testns.NFT(t, ns, "add", "table", "ip", "someone-else")
	if n := checkedSync(t, b, st, "another table"); n != all {
		t.Errorf("after a foreign commit: read %d tables, want %d", n, all)
	}
}

// A large transaction of ours is sent with the monitor out of the
// notification group; a change to our table made meanwhile goes unseen by
// the monitor, so the generation must give it away and mark every table.
func TestKernelMutedCommitMissesNothing(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
	st := demoState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	mon := monitorOf(t, b)
	gen, err := b.kern().Generation()
	if err != nil {
		t.Fatal(err)
	}
	// What Sync does around a large transaction, with someone else's
	// commit to our table where ours would be.
	if err := mon.SetMember(false); err != nil {
		t.Fatal(err)
	}
	testns.NFT(t, ns, "insert", "rule", "ip", DefaultTableName, "KUBE-SERVICES", "drop")
	b.tx.rejoin(mon, commitReport{genBefore: gen})
	if _, all := mon.Take(); !all {
		t.Fatal("a commit made while the monitor was out of the group left no mark")
	}
	// Without the foreign commit, a muted transaction of ours marks nothing.
	gen, err = b.kern().Generation()
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.SetMember(false); err != nil {
		t.Fatal(err)
	}
	b.tx.rejoin(mon, commitReport{genBefore: gen})
	if marked, all := mon.Take(); all || len(marked) > 0 {
		t.Errorf("a quiet muted window marked %v (all: %v), want nothing", marked, all)
	}
}

// A change to our table by another process is reported at once
// (OnForeignChange, which the proxy turns into a sync), and that sync
// checks and repairs it without waiting for CheckEvery.
func TestKernelForeignChangeRepairedAtOnce(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	told := make(chan struct{}, 1)
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Hour, OnForeignChange: func() {
		select {
		case told <- struct{}{}:
		default:
		}
	}})
	st := demoState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	monitorOf(t, b)
	testns.NFT(t, ns, "insert", "rule", "ip", DefaultTableName, "KUBE-SERVICES", "drop")
	select {
	case <-told:
	case <-time.After(10 * time.Second):
		t.Fatal("no OnForeignChange within 10 s of a rogue rule in our table")
	}
	res, err := b.Sync(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if drift := b.kern().drift; !res.Changed || len(drift) == 0 {
		t.Fatalf("the sync after the change: changed %v, drift %q; want a repair within the check period", res.Changed, drift)
	}
	assertKernelIsRender(t, ns, st)
}

// Another process's change to our table that lands between the
// transactions of a staged first sync (the monitor is out of the
// notification group meanwhile) asks for a check as soon as the sync
// ends, and that check repairs it: it used to wait for the periodic one.
func TestKernelForeignChangeDuringStagedSync(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	told := 0
	testns.NFT(t, ns, "list", "tables") // skips without nft
	rogue, rogueErr := false, error(nil)
	addRogue := func() { // on the encoder's goroutine, between commits
		if !rogue {
			rogue = true
			cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader("add table ip " + DefaultTableName + "\nadd chain ip " + DefaultTableName +
				" rogue { type filter hook input priority 0; policy drop; }\n")
			if out, err := cmd.CombinedOutput(); err != nil {
				rogueErr = fmt.Errorf("%w: %s", err, out)
			}
		}
	}
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Hour, OnForeignChange: func() { told++ },
		Strategy: Strategy{StageRules: 2, StagePieces: 1 << 20, StageReleaseBytes: 1, OnLargeTxRound: addRogue}}) // two rules a piece
	st := tinyState(fiveServices())
	res, err := b.Sync(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if !rogue || rogueErr != nil || res.Messages == 0 {
		t.Fatalf("the sync was not staged, or the rogue chain not added (called: %v, err: %v)", rogue, rogueErr)
	}
	if told == 0 {
		t.Fatal("a change made during the staged sync asked for no check")
	}
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if drift := b.kern().drift; !containsSub(drift, "rogue") {
		t.Errorf("the check after the staged sync found %q, want the rogue chain", drift)
	}
	assertKernelIsRender(t, ns, st)
}

// The monitor names the chain or set of each event but those of the table,
// stateful objects and flowtables. A check then reads back only those
// chains and sets, and the sync repairs them in place, in one transaction
// as small as the change: our chains and maps rewritten or created again,
// chains and sets not ours deleted. Anything else, or a repair the kernel
// refuses, makes it a full sync.
func TestKernelChangeRepairedInPlace(t *testing.T) {
	ns, b, st := syncedDemo(t)
	mon := monitorOf(t, b)
	const tbl = "ip " + DefaultTableName + " "
	web := proxierName("default", "web", "http")
	svc := ServiceChain(web, model.TCP)
	sep := EndpointChain(web, model.TCP, "10.244.0.10:8080")
	for _, tc := range []struct {
		name     string
		script   string
		drift    string // one of the differences found
		whole    bool   // a full sync repairs it
		messages int    // at most, in place
	}{
		{"a rogue rule", "insert rule " + tbl + "KUBE-SERVICES drop\n", "chain KUBE-SERVICES: rule 1 (handle", false, 1},
		{"two chains flushed", "flush chain " + tbl + sep + "\nflush chain " + tbl + "KUBE-NODEPORTS\n", "chain KUBE-NODEPORTS: 0 rules, want 1", false, 8},
		{"a rogue chain", "add chain " + tbl + "rogue\nadd rule " + tbl + "rogue drop\n", "chain rogue: not ours", false, 4},
		{"a rogue chain jumped to", "add chain " + tbl + "rogue\nadd rule " + tbl + "rogue drop\ninsert rule " + tbl + "KUBE-SERVICES jump rogue\n",
			"chain rogue: not ours", false, 8},
		{"a rogue input chain dropping", "add chain " + tbl + "rogue { type filter hook input priority 0; policy drop; }\n",
			"chain rogue: not ours, a base chain (type filter hook input priority 0 policy drop", false, 3},
		{"our input chain dropping", "add chain " + tbl + "filter-input { type filter hook input priority filter; policy drop; }\n",
			"chain filter-input: type filter hook input priority 0 policy drop", false, 6},
		{"a rogue set in our chain", "add set " + tbl + "rogue { type ipv4_addr; elements = { 10.0.0.1 }; }\ninsert rule " + tbl + "KUBE-SERVICES ip saddr @rogue drop\n",
			"set rogue: not ours", false, 8},
		{"an anonymous set in our chain", "insert rule " + tbl + "KUBE-SERVICES ip saddr { 10.0.0.1, 10.0.0.2 } drop\n", "chain KUBE-SERVICES: rule 1 (handle", false, 1},
		{"an endpoint chain deleted", "flush chain " + tbl + svc + "\ndelete chain " + tbl + sep + "\n", "chain " + sep + ": missing", false, 12},
		{"a map deleted", "flush chain " + tbl + "KUBE-PROXY-FIREWALL\ndelete map " + tbl + "firewall-ips\n", "map firewall-ips: missing", false, 8},
		{"a counter used by our chain", "add counter " + tbl + "rogue\ninsert rule " + tbl + "KUBE-SERVICES counter name rogue\n", "counter rogue: not ours", false, 8},
		{"a dormant table", "add table " + tbl + "{ flags dormant; }\n", "flags 0x1, want 0", false, 3},
		{"the table deleted", "delete table " + tbl + "\n", "table ip kube-nftproxy: missing", true, 0},
		{"a chain renamed", "rename chain " + tbl + sep + " renamed\n", "chain renamed: not ours", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testns.NFTScript(t, ns, tc.script)
			testutil.WaitFor(t, 10*time.Second, "the monitor to see the change", mon.Pending)
			b.kern().drift = nil
			res, err := b.Sync(context.Background(), st)
			if err != nil {
				t.Fatal(err)
			}
			if drift := b.kern().drift; !containsSub(drift, tc.drift) || !res.Changed || res.Full != tc.whole {
				t.Errorf("repair: drift %q, changed %v, full %v; want %q found, full %v", drift, res.Changed, res.Full, tc.drift, tc.whole)
			}
			if !tc.whole && res.Messages > tc.messages {
				t.Errorf("the repair in place sent %d messages, want at most %d", res.Messages, tc.messages)
			}
			assertKernelIsRender(t, ns, st)
		})
	}
}

// A removed element of a map is compared and repaired in place too: that
// map alone read back, the element alone added again.
func TestKernelElementChangeRepairedInPlace(t *testing.T) {
	ns, b, st := syncedDemo(t)
	testns.NFT(t, ns, "delete", "element", "ip", DefaultTableName, "service-ips", "{ 10.96.0.10 . tcp . 80 }")
	testutil.WaitFor(t, 10*time.Second, "the monitor to see the change", monitorOf(t, b).Pending)
	res, err := b.Sync(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if drift := b.kern().drift; !containsSub(drift, "map service-ips: element 10.96.0.10 . tcp . 80 missing") || res.Full || !res.Changed {
		t.Errorf("repair: drift %q, full %v, changed %v; want the element found and repaired in place", drift, res.Full, res.Changed)
	}
	if res.Messages != 1 {
		t.Errorf("the repair sent %d messages, want 1: the missing element added", res.Messages)
	}
	assertKernelIsRender(t, ns, st)
}

// syncedDemo programs demoState in a new namespace, with drift checks
// only when the monitor asks for one.
func syncedDemo(t *testing.T) (string, *Backend, *model.State) {
	t.Helper()
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Hour})
	st := demoState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return ns, b, st
}
