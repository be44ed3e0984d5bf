package nft

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// readBackDrift reads every table back and compares it with want, whatever
// the generation says.
func readBackDrift(t *testing.T, b *Backend, want map[tableID]*nftlib.Table) map[string][]string {
	t.Helper()
	kts, err := b.readKernel(want)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, id := range tableIDs() {
		diffs, err := b.kern().TableDrift(want[id], kts[id], nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(diffs) > 0 {
			out[want[id].Name] = diffs
		}
	}
	return out
}

// The kernel's dump of a rule is not byte-equal to what we send (attribute
// order, NLA_F_NESTED, register numbering, defaults): after programming
// every golden state, the canonical forms of all rules, and every other
// attribute of our tables, compare equal.
func TestKernelRuleDumpCanonical(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			b := openTestBackend(t, ns, tc.cfg)
			if _, err := b.Sync(context.Background(), tc.st); err != nil {
				t.Fatal(err)
			}
			if d := readBackDrift(t, b, b.appliedTables(tableIDs())); len(d) > 0 {
				t.Errorf("read-back right after a full sync differs: %v", d)
			}
		})
	}
}

// tamperCase changes our tables with nft behind the backend's back.
type tamperCase struct {
	name string
	nft  [][]string // nft commands, run in order
	want string     // a substring of one reported difference
}

func tamperCases() []tamperCase {
	web := proxierName("default", "web", "http")
	sep := EndpointChain(web, model.TCP, "10.244.0.10:8080")
	svc := ServiceChain(web, model.TCP)
	tbl := []string{"ip", DefaultTableName}
	cmd := func(args ...string) []string {
		// e.g. cmd("delete chain", "X") -> nft delete chain ip kube-nftproxy X
		out := strings.Fields(args[0])
		out = append(out, tbl...)
		return append(out, args[1:]...)
	}
	return []tamperCase{
		{"deleted base chain", [][]string{cmd("delete chain", "nat-prerouting")}, "chain nat-prerouting: missing"},
		{"flushed table", [][]string{cmd("flush table")}, "rules, want"},
		{"emptied endpoint chain", [][]string{cmd("flush chain", sep)}, "chain " + sep + ": 0 rules, want 2"},
		{"deleted endpoint chain", [][]string{cmd("flush chain", svc), cmd("delete chain", sep)}, "chain " + sep + ": missing"},
		{"deleted service-ips element", [][]string{cmd("delete element", "service-ips", "{ 10.96.0.10 . tcp . 80 }")},
			"map service-ips: element 10.96.0.10 . tcp . 80 missing"},
		{"rogue drop rule", [][]string{cmd("insert rule", "KUBE-SERVICES", "drop")}, "chain KUBE-SERVICES: rule 1 "},
		{"rogue drop base chain", [][]string{cmd("add chain", "rogue", "{ type filter hook prerouting priority 0; policy drop; }")},
			"chain rogue: not ours, a base chain"},
		{"flushed rogue drop base chain", [][]string{
			cmd("add chain", "rogue", "{ type filter hook input priority 0; policy drop; }"), cmd("flush chain", "rogue")},
			"chain rogue: not ours, a base chain"},
		{"base chain policy drop", [][]string{cmd("chain", "filter-input", "{ policy drop; }")}, "policy drop"},
		{"base chain priority", [][]string{cmd("delete chain", "nat-output"),
			cmd("add chain", "nat-output", "{ type nat hook output priority 50; }"), cmd("add rule", "nat-output", "jump", "KUBE-SERVICES")},
			"chain nat-output: type nat hook output priority 50"},
		{"dormant table", [][]string{cmd("add table", "{ flags dormant; }")}, "flags 0x1, want 0"},
		{"map of another type", [][]string{cmd("flush table"), cmd("delete map", "service-ips"),
			cmd("add map", "service-ips", "{ type ipv4_addr : verdict; }")}, "map service-ips: flags"},
		{"regular chain as base chain", [][]string{cmd("flush chain", svc), cmd("delete chain", sep),
			cmd("add chain", sep, "{ type filter hook forward priority 0; policy drop; }")}, "chain " + sep + ": type filter hook forward"},
		{"table re-created with another comment", [][]string{cmd("delete table"), cmd("add table", "{ comment \"someone else's\"; }")},
			"comment differs"},
		{"deleted cluster-ips element", [][]string{cmd("delete element", "cluster-ips", "{ 10.96.0.10 }")},
			"set cluster-ips: element 10.96.0.10 missing"},
		{"rogue cluster-ips element", [][]string{cmd("add element", "cluster-ips", "{ 10.96.0.77 }")},
			"set cluster-ips: element 10.96.0.77 is not ours"},
		{"cluster-ips element's comment", [][]string{cmd("delete element", "cluster-ips", "{ 10.96.0.10 }"),
			cmd("add element", "cluster-ips", "{ 10.96.0.10 comment \"someone\" }")}, "set cluster-ips: element 10.96.0.10: comment differs"},
		{"cluster-ips a map", [][]string{cmd("flush table"), cmd("delete set", "cluster-ips"),
			cmd("add map", "cluster-ips", "{ type ipv4_addr : verdict; }")}, "set cluster-ips: flags"},
	}
}

// inPlace are the tamperCases that change chains, rules, sets and elements
// only, in ways a repair in place can undo: with the change monitor, only
// the chains and sets it names are compared and repaired.
var inPlace = map[string]bool{"flushed table": true, "emptied endpoint chain": true, "rogue drop rule": true,
	"deleted service-ips element": true, "deleted cluster-ips element": true, "rogue cluster-ips element": true,
	"cluster-ips element's comment": true, "deleted base chain": true, "deleted endpoint chain": true,
	"rogue drop base chain": true, "flushed rogue drop base chain": true, "base chain policy drop": true,
	"base chain priority": true, "dormant table": true}

// Each tampering is found by the periodic check, reported, and repaired by
// one transaction, after which the kernel holds exactly what we render:
// with the change monitor, which reads back only the table nft changed
// (only the chains it names, when rules alone changed), and without
// (every table read back).
func TestKernelTamperingRepaired(t *testing.T) {
	for _, mode := range []string{"monitor", "no-monitor"} {
		for _, tc := range tamperCases() {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				ns := testns.New(t, "knp-nft-")
				b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
				b.kern().noWatch = mode == "no-monitor"
				ctx := context.Background()
				st := demoState()
				for i := 0; i < 2; i++ { // program, then check clean (verified from here)
					if _, err := b.Sync(ctx, st); err != nil {
						t.Fatal(err)
					}
				}
				if found := b.kern().drift; len(found) > 0 {
					t.Fatalf("drift reported before any tampering: %q", found)
				}
				if (b.k.Monitor() != nil) != (mode == "monitor") {
					t.Fatalf("monitor open: %v", b.k.Monitor() != nil)
				}
				for _, args := range tc.nft {
					testns.NFT(t, ns, args...)
				}
				before, reads := b.kern().commits, b.kern().readBacks
				res, err := b.Sync(ctx, st)
				if err != nil {
					t.Fatalf("repairing sync: %v", err)
				}
				// The monitor names the chains and sets changed, which
				// are repaired in place.
				wantFull := mode == "no-monitor" || !inPlace[tc.name]
				if res.Full != wantFull || !res.Changed || b.kern().commits-before != 1 {
					t.Errorf("repair: full=%v changed=%v transactions=%d, want one transaction, full %v", res.Full, res.Changed, b.kern().commits-before, wantFull)
				}
				wantReads := len(tableIDs())
				if mode == "monitor" {
					wantReads = 1 // every case changes ip kube-nftproxy only
				}
				if n := b.kern().readBacks - reads; n != wantReads {
					t.Errorf("the check read %d tables back, want %d", n, wantReads)
				}
				if found := b.kern().drift; !containsSub(found, tc.want) {
					t.Errorf("reported %q, want one containing %q", found, tc.want)
				}
				assertKernelIsRender(t, ns, st)
				b.kern().drift = nil
				if res, err := b.Sync(ctx, st); err != nil || len(b.kern().drift) > 0 {
					t.Errorf("check after the repair: full=%v err=%v drift=%q", res.Full, err, b.kern().drift)
				}
				assertKernelIsRender(t, ns, st)
			})
		}
	}
}

// A restarted proxy (a new Backend, first sync full) repairs the same
// tamperings in its first transaction.
func TestKernelTamperingRepairedByRestart(t *testing.T) {
	for _, tc := range tamperCases() {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			st := demoState()
			if _, err := openTestBackend(t, ns, demoConfig()).Sync(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			for _, args := range tc.nft {
				testns.NFT(t, ns, args...)
			}
			b := openTestBackend(t, ns, demoConfig())
			if _, err := b.Sync(context.Background(), st); err != nil {
				t.Fatalf("first sync after a restart: %v", err)
			}
			if b.kern().commits != 1 {
				t.Errorf("restart took %d transactions, want 1", b.kern().commits)
			}
			assertKernelIsRender(t, ns, st)
		})
	}
}

func containsSub(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// assertKernelIsRender compares nft's listing with our render, leaving out
// chains that are flushed and left for the next sync to delete.
func assertKernelIsRender(t *testing.T, ns string, st *model.State) {
	t.Helper()
	got := testns.NFT(t, ns, "list", "ruleset")
	var kept []string
	lines := strings.Split(got, "\n")
	for i := 0; i < len(lines); i++ {
		if n := emptyChainLines(lines[i:]); n > 0 {
			i += n - 1 // an empty stale chain (with its comment, if any)
			if i+1 < len(lines) && lines[i+1] == "" {
				i++ // and the blank line after it
			}
			continue
		}
		kept = append(kept, lines[i])
	}
	want := Build(st, demoConfig()).String()
	if testutil.SortedText(strings.Join(kept, "\n")) != testutil.SortedText(want) {
		t.Errorf("kernel differs from render:\n%s\n--- want:\n%s", got, want)
	}
}

// emptyChainLines is how many lines of `nft list` output an empty chain
// takes at the start of lines (its comment included), or 0.
func emptyChainLines(lines []string) int {
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "\tchain ") {
		return 0
	}
	n := 1
	if strings.HasPrefix(lines[n], "\t\tcomment ") {
		n++
	}
	if n < len(lines) && lines[n] == "\t}" {
		return n + 1
	}
	return 0
}

// A table of ours that another process created with NFT_TABLE_F_OWNER
// gives a clear error naming it, not a refused transaction every second.
func TestKernelOwnedTable(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	owner, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close() // the kernel deletes the table with its owner's socket
	bt := owner.NewTx()
	bt.AddOwnedTable(nftlib.IPv6, DefaultTableName, "")
	if err := owner.CommitTx(bt); err != nil {
		// NFT_TABLE_F_OWNER came in Linux 5.12: before it no process can
		// own a table, and the kernel refuses the unknown flag.
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			t.Skipf("this kernel has no owned tables (NFT_TABLE_F_OWNER, Linux 5.12+): %v", err)
		}
		t.Fatal(err)
	}
	b := openTestBackend(t, ns, demoConfig())
	_, err = b.Sync(context.Background(), demoState())
	var owned *nftlib.TableOwnedError
	if !errors.Is(err, nftlib.ErrTableOwned) || !errors.As(err, &owned) || owned.Table != DefaultTableName || owned.Family != nftlib.IPv6 {
		t.Fatalf("sync error = %v, want a TableOwnedError for ip6 %s", err, DefaultTableName)
	}
	if !strings.Contains(err.Error(), "ip6 kube-nftproxy is owned by another process") {
		t.Errorf("error does not say who holds what: %v", err)
	}
	if b.kern().commits != 0 {
		t.Errorf("sent %d transactions to an owned table", b.kern().commits)
	}
}

// The check reads nothing back while the generation says only our own
// transactions committed; when another process committed, it reads back
// only the tables the monitor saw it change (none here: it changed its
// own table).
func TestKernelCheckGeneration(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond})
	ctx := context.Background()
	st := demoState()
	sync := func(st *model.State, what string) {
		t.Helper()
		kernelReads, readBacks := b.kern().reads, b.kern().readBacks
		res, err := b.Sync(ctx, st)
		if found := b.kern().drift; err != nil || res.Full || len(found) > 0 {
			t.Fatalf("%s: full=%v err=%v drift=%q", what, res.Full, err, found)
		}
		if n := b.kern().reads - kernelReads; n != 0 || b.kern().readBacks != readBacks {
			t.Errorf("%s: %d reads of the kernel, %d tables read back, want none", what, n, b.kern().readBacks-readBacks)
		}
	}
	if _, err := b.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	sync(st, "first check")
	sync(st, "nothing changed")
	next := shallowCopy(st)
	web := proxierName("default", "web", "http")
	next.Endpoints = next.Endpoints.With(web, next.Endpoints.Get(web)[1:])
	sync(next, "our own change")
	sync(next, "after our own change")
	testns.NFT(t, ns, "add", "table", "ip", "someone-else")
	sync(next, "another table committed")
	testns.NFT(t, ns, "add", "table", "inet", DefaultTableName)
	sync(next, "a table of our name in another family")
	sync(next, "verified again")
	testns.NFT(t, ns, "delete", "table", "ip", DefaultTableName+deltaSuffix)
	reads := b.kern().readBacks
	if res, err := b.Sync(ctx, next); err != nil || !res.Full || b.kern().readBacks-reads != 1 {
		t.Errorf("the delta table deleted: full=%v err=%v, %d tables read back, want a full sync after reading 1", res.Full, err, b.kern().readBacks-reads)
	}
}

// createOwnedTable creates table ip6|ip name owned by a socket of its own,
// as `nft -i` with `flags owner` does; closing the returned kernel makes
// the kernel delete the table, without a notification or a new generation.
func createOwnedTable(t *testing.T, ns string, f nftlib.Family, name string, deleteFirst bool) *nftlib.Kernel {
	t.Helper()
	owner, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	bt := owner.NewTx()
	if deleteFirst {
		bt.DelTable(f, name)
	}
	bt.AddOwnedTable(f, name, "")
	if err := owner.CommitTx(bt); err != nil {
		owner.Close()
		// NFT_TABLE_F_OWNER came in Linux 5.12: before it no process can
		// own a table, and the kernel refuses the unknown flag.
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			t.Skipf("this kernel has no owned tables (NFT_TABLE_F_OWNER, Linux 5.12+): %v", err)
		}
		t.Fatal(err)
	}
	return owner
}

// Our table replaced by one another process owns: every sync fails (a
// refusal found before the commit must not let the next sync pass as
// partial with nothing to write), and the first sync after the owner
// exits writes the table again, though the kernel said nothing of it.
func TestKernelOwnedTableTakenOver(t *testing.T) {
	ns, b, st := syncedDemo(t)
	owner := createOwnedTable(t, ns, nftlib.IPv4, DefaultTableName, true)
	defer owner.Close()
	testutil.WaitFor(t, 10*time.Second, "the monitor to see the new table", func() bool {
		return b.k.Monitor() != nil && b.k.Monitor().Pending()
	})
	for i := range 3 {
		if _, err := b.Sync(context.Background(), st); !errors.Is(err, nftlib.ErrTableOwned) {
			t.Fatalf("sync %d while the table is owned: err %v, want ErrTableOwned", i+1, err)
		}
	}
	owner.Close()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatalf("sync after the owner exited: %v", err)
	}
	assertKernelIsRender(t, ns, st)
}
