package proxy

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// countLogged counts the lines of the proxy's log that contain substr.
func (p *proxy) countLogged(substr string) int {
	n := 0
	for _, l := range p.log.lines() {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// driftLogged counts the proxy's "changed behind our back" warnings.
func (p *proxy) driftLogged() int { return p.countLogged("changed behind our back") }

// repairServices is how many more Services TestFaultTamperingDuringRepair
// programs: enough that a repair (a full sync) is a transaction of
// thousands of messages, during which the change monitor leaves the
// notification group.
const repairServices = 1500

// TestFaultTamperingDuringRepair flushes a Service's chain, waits for the
// proxy to say it saw the change, and flushes it again while the repair
// commits: once, or every 25 ms for a second. A flush that lands during
// our own transaction, when the change monitor is out of the notification
// group, must be repaired as soon as the transaction ends, not at the
// periodic sync (30 s here).
func TestFaultTamperingDuringRepair(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{
		"load-services.yaml":       loadServices(repairServices),
		"load-endpointslices.yaml": loadSlices(repairServices, loadPortBase),
	}})
	e.waitRendered(t, 30*time.Second, "before tampering")
	chain := svcChain(webSPN, "tcp")
	flush := fmt.Sprintf("flush chain ip kube-nftproxy %s\n", chain)
	// The delays place the fault (when it lands), they wait for nothing:
	// 0.25-0.3 s after the warning met the repair's commit in 3 of 5
	// tries on a node of 1-2k Services; the burst covers the whole repair.
	for _, tc := range []struct {
		name         string
		delay, burst time.Duration
	}{
		{"again 0s after the warning", 0, 0},
		{"again 300ms after the warning", 300 * time.Millisecond, 0},
		{"every 25ms for 1s after the warning", 0, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := e.startExampleFlows(t)
			seen := e.proxy.driftLogged()
			if err := e.nftScript(t.Context(), flush); err != nil {
				t.Fatal(err)
			}
			e.proxy.waitLog(t, 5*time.Second, "the drift warning", func([]string) bool { return e.proxy.driftLogged() > seen })
			time.Sleep(tc.delay)
			e.flushFor(t, flush, tc.burst)
			t0 := time.Now()
			// The chain alone is polled (listing 1,500 Services in a loop
			// would slow down what it measures); the whole listing then
			// proves the repair.
			e.proxy.poll(t, 5*time.Second, "the chain refilled", func(ctx context.Context) error {
				out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "chain", "ip", "kube-nftproxy", chain)
				if n := strings.Count(string(out), "KUBE-SEP-"); err != nil || n == 0 {
					return fmt.Errorf("%d rules to a KUBE-SEP chain (%v)", n, err)
				}
				return nil
			})
			repaired := time.Since(t0)
			e.waitRendered(t, 10*time.Second, "after the last flush")
			res := f.stop(t)
			logFault(t, fmt.Sprintf("nft: a KUBE-SVC chain flushed %s (%d Services, sync period 30 s)", tc.name, repairServices), repaired, res)
		})
	}
}

// TestFaultForeignChainsRepairedInPlace adds what the drift probes added to
// a node of 1,500 Services: a base chain that drops all input (the health
// port's traffic too), a counter used by a rule in KUBE-SERVICES, our
// table made dormant. Each is repaired in place, that change alone, at
// once: no full sync, no table-wide compare.
func TestFaultForeignChainsRepairedInPlace(t *testing.T) {
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{
		"load-services.yaml":       loadServices(repairServices),
		"load-endpointslices.yaml": loadSlices(repairServices, loadPortBase),
	}})
	e.waitRendered(t, 30*time.Second, "before tampering")
	const tbl = "ip kube-nftproxy "
	// list lists what tampering added (a short listing: the whole table
	// takes longer than the repair); gone matches it until it is repaired.
	for _, tc := range []struct {
		name, script, gone string
		list               []string
	}{
		{"a policy-drop input chain", "add chain " + tbl + "rogue { type filter hook input priority 0; policy drop; }\n", "chain rogue",
			[]string{"list", "chains", "ip"}},
		{"a counter in KUBE-SERVICES", "add counter " + tbl + "rogue\ninsert rule " + tbl + "KUBE-SERVICES counter name rogue\n", "counter rogue",
			[]string{"list", "counters", "ip"}},
		{"the table dormant", "add table " + tbl + "{ flags dormant; }\n", `"name": "kube-nftproxy", "handle": \d+, "flags"`,
			[]string{"-j", "list", "tables", "ip"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := e.startExampleFlows(t)
			repairs, fullBefore := e.proxy.inPlaceRepairs(), e.proxy.fullSyncs()
			if err := e.nftScript(t.Context(), tc.script); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			e.proxy.waitLog(t, 5*time.Second, "a sync after the repair's warning", func(lines []string) bool {
				return syncedAfterRepair(lines, repairs)
			})
			repaired := time.Since(t0)
			e.proxy.poll(t, 5*time.Second, "the change undone", func(ctx context.Context) error {
				out, err := e.sb.Exec(ctx, sandbox.Node, append([]string{"nft"}, tc.list...)...)
				if err != nil || regexp.MustCompile(tc.gone).Match(out) {
					return fmt.Errorf("%q still there (%v)", tc.gone, err)
				}
				return nil
			})
			e.waitRendered(t, 10*time.Second, "after the repair")
			if n := e.proxy.inPlaceRepairs() - repairs; n != 1 {
				t.Errorf("%d repairs in place, want 1", n)
			}
			if full := e.proxy.fullSyncs(); full != fullBefore {
				t.Errorf("%d full syncs after the tampering, want none", full-fullBefore)
			}
			res := f.stop(t)
			logFault(t, fmt.Sprintf("nft: %s added to our table (%d Services)", tc.name, repairServices), repaired, res)
		})
	}
}

// syncedAfterRepair reports whether the log has a sync after the warning
// of the repair in place that follows the first `before` ones.
func syncedAfterRepair(lines []string, before int) bool {
	seen := 0
	for _, l := range lines {
		switch {
		case strings.Contains(l, "rewriting what another process changed"):
			seen++
		case seen > before && strings.Contains(l, `"synced"`):
			return true
		}
	}
	return false
}

// fullSyncs counts the proxy's full syncs.
func (p *proxy) fullSyncs() int { return p.countLogged(`"synced" full=true`) }

// inPlaceRepairs counts the proxy's warnings of repairs in place.
func (p *proxy) inPlaceRepairs() int { return p.countLogged("rewriting what another process changed") }

// nftShell is an `nft -i` in the node namespace: one process, one
// netlink socket, for as long as it runs.
type nftShell struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out strings.Builder
}

func (e *env) startNFTShell(t *testing.T) *nftShell {
	t.Helper()
	sh := &nftShell{cmd: e.sb.Command(t.Context(), sandbox.Node, "nft", "-i")}
	var err error
	if sh.in, err = sh.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	sh.cmd.Stdout, sh.cmd.Stderr = &sh.out, &sh.out
	if err := sh.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return sh
}

func (sh *nftShell) send(t *testing.T, script string) {
	t.Helper()
	if _, err := io.WriteString(sh.in, script); err != nil {
		t.Fatal(err)
	}
}

// close ends nft once it has run what it was sent; the test fails if nft
// reported an error.
func (sh *nftShell) close(t *testing.T) {
	t.Helper()
	sh.in.Close()
	if err := sh.cmd.Wait(); err != nil || strings.Contains(sh.out.String(), "Error") {
		t.Errorf("nft -i: %v: %s", err, sh.out.String())
	}
}

// flushFor runs script once, or every 25 ms for burst, through one nft
// process, and returns once nft has applied the last one.
func (e *env) flushFor(t *testing.T, script string, burst time.Duration) {
	t.Helper()
	sh := e.startNFTShell(t)
	for end := time.Now().Add(burst); ; {
		sh.send(t, script)
		if time.Now().After(end) {
			break
		}
		time.Sleep(25 * time.Millisecond) // the fault's pace
	}
	sh.close(t)
}

// ownTable replaces the proxy's ip table with one that `nft -i` owns
// (NFT_TABLE_F_OWNER): the kernel refuses every change to it from another
// process until nft exits, and then deletes it without telling anyone.
// release ends nft.
func (e *env) ownTable(t *testing.T) (release func()) {
	t.Helper()
	sh := e.startNFTShell(t)
	sh.send(t, "delete table ip kube-nftproxy; add table ip kube-nftproxy { flags owner; }\n")
	e.proxy.poll(t, 5*time.Second, "the owned table", func(ctx context.Context) error {
		got, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "table", "ip", "kube-nftproxy")
		if err != nil || !strings.Contains(string(got), "flags owner") {
			return fmt.Errorf("not owned yet (%v): %s", err, got)
		}
		return nil
	})
	return func() { sh.close(t) }
}

// TestFaultOwnedTable: another process replaces our table with one it
// owns. Every sync is refused meanwhile (the node has no Service rules of
// that family, which the flows count); /readyz turns 503 once that has
// lasted a sync period, with a warning and kubenftproxy_sync_failing 1;
// once the owner exits (the kernel deletes its table and tells no one)
// the table is back within about a second, and /readyz is 200 again.
func TestFaultOwnedTable(t *testing.T) {
	t.Parallel()
	args := []string{"--iptables-sync-period", tamperSyncPeriod.String()}
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, proxyArgs: args})
	e.proxy.expectedErrors = append(e.proxy.expectedErrors, "owned by another process")
	e.waitRendered(t, 10*time.Second, "before the takeover")
	f := e.startExampleFlows(t)
	release := e.ownTable(t)
	owned := time.Now()
	e.proxy.poll(t, 3*tamperSyncPeriod, "/readyz 503 while the table is owned", func(ctx context.Context) error {
		return e.expectProbe(ctx, "/readyz", 503)
	})
	notReady := time.Since(owned)
	e.proxy.waitLog(t, 5*time.Second, "the warning that syncs keep failing", func(lines []string) bool {
		return e.proxy.countLogged("syncs have failed for longer than the sync period") > 0
	})
	e.proxy.poll(t, 5*time.Second, "kubenftproxy_sync_failing 1", func(ctx context.Context) error {
		return e.expectMetric(ctx, "kubenftproxy_sync_failing 1")
	})
	if code, _, err := e.health(t.Context(), "/livez"); err != nil || code != 200 {
		t.Errorf("/livez while the table is owned: %d %v, want 200 (a restart would not help)", code, err)
	}
	release()
	t0 := time.Now()
	e.waitRendered(t, 5*time.Second, "after the owner exited")
	repaired := time.Since(t0)
	e.proxy.poll(t, 5*time.Second, "/readyz 200 again", func(ctx context.Context) error {
		return e.expectProbe(ctx, "/readyz", 200)
	})
	if err := e.expectMetric(t.Context(), "kubenftproxy_sync_failing 0"); err != nil {
		t.Error(err)
	}
	res := f.stop(t)
	t.Logf("/readyz 503 %v after the takeover (sync period %v)", notReady.Round(time.Millisecond), tamperSyncPeriod)
	logFault(t, "nft: our table replaced by one another process owns, then the owner exits", repaired, res)
}

// expectProbe GETs path of the health server and wants code.
func (e *env) expectProbe(ctx context.Context, path string, code int) error {
	got, body, err := e.health(ctx, path)
	if err != nil {
		return err
	}
	if got != code {
		return fmt.Errorf("%s: %d %s, want %d", path, got, body, code)
	}
	return nil
}

// expectMetric wants line in the proxy's /metrics.
func (e *env) expectMetric(ctx context.Context, line string) error {
	_, body, err := getIn(ctx, e.sb, sandbox.Node, metricsURL)
	if err != nil {
		return err
	}
	for l := range strings.Lines(body) {
		if strings.TrimSpace(l) == line {
			return nil
		}
	}
	return fmt.Errorf("/metrics has no line %q", line)
}
