package proxy

// Helpers of the fault-injection tests (faults_*_test.go, issue 9: "never
// lose a node's rules, never run silently broken"): background traffic to
// a good Service that every scenario runs under, the summary line each
// fault logs for the README's table, the proxy's health endpoints and
// memory, and the kernel's ruleset against what `render` prints.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// The background flows: one request every flowInterval (each a new TCP
// connection, or a new UDP socket), each allowed flowTimeout, for at most
// flowLimit and flowCount requests; the test stops them earlier.
const (
	flowInterval = 5 * time.Millisecond
	flowTimeout  = time.Second
	flowLimit    = 5 * time.Minute
	flowCount    = 200_000
	// flowMinReplies is what each flow must have answered before it is
	// stopped and judged.
	flowMinReplies = 5
)

// flows is the background traffic of a fault scenario: a steady flow of
// short TCP connections and a UDP request/response flow from pod-c, which
// backs nothing, to a good Service's ClusterIP.
type flows struct {
	tcp, udp *trafficLoop
}

// startFlows starts the flows from pod-c to tcpAddr and udpAddr. The end of
// the test stops them if the test has not.
func (e *env) startFlows(t *testing.T, tcpAddr, udpAddr string) *flows {
	t.Helper()
	extra := []string{
		"--duration", flowLimit.String(), "--count", strconv.Itoa(flowCount),
		"--interval", flowInterval.String(), "--timeout", flowTimeout.String(),
		"--announce", strconv.Itoa(flowMinReplies),
	}
	f := &flows{
		tcp: e.startLoop(t, podC.Name, "tcp", tcpAddr, extra...),
		udp: e.startLoop(t, podC.Name, "udp", udpAddr, extra...),
	}
	t.Cleanup(func() {
		for _, l := range []*trafficLoop{f.tcp, f.udp} {
			_ = l.proc.Signal(syscall.SIGINT)
		}
	})
	return f
}

// startExampleFlows runs the flows to the example's web (TCP) and dns-like
// (UDP) ClusterIPs.
func (e *env) startExampleFlows(t *testing.T) *flows {
	t.Helper()
	return e.startFlows(t, hostPort(webClusterIPv4, webPort), hostPort(dnsClusterIP, dnsPort))
}

// flowResult is what the flows saw.
type flowResult struct {
	tcp, udp *echo.Summary
	started  [2]time.Time // of tcp and udp, to put results on the clock
}

// stop ends both flows, once each has had flowMinReplies replies, and
// returns their summaries. Both must still have been running (a flow that
// ended early had hit its bounds).
func (f *flows) stop(t *testing.T) flowResult {
	t.Helper()
	f.tcp.awaitReplies(t, flowMinReplies)
	f.udp.awaitReplies(t, flowMinReplies)
	f.tcp.stop(t)
	f.udp.stop(t)
	return flowResult{tcp: f.tcp.wait(t), udp: f.udp.wait(t), started: [2]time.Time{f.tcp.started, f.udp.started}}
}

// failed is the number of failed requests of both flows.
func (r flowResult) failed() int { return r.tcp.Failed + r.udp.Failed }

// gap is the longer of the two flows' longest gaps without a reply.
func (r flowResult) gap() time.Duration {
	return msDuration(max(r.tcp.LongestGapMS, r.udp.LongestGapMS))
}

func msDuration(ms float64) time.Duration {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond)
}

// String is the flows' numbers for a log line.
func (r flowResult) String() string {
	return fmt.Sprintf("tcp %d ok/%d failed, longest gap %v; udp %d ok/%d failed, longest gap %v",
		r.tcp.OK, r.tcp.Failed, msDuration(r.tcp.LongestGapMS), r.udp.OK, r.udp.Failed, msDuration(r.udp.LongestGapMS))
}

// expectNoFailures fails the test if a request of the flows failed or if
// they did not carry much traffic, and lists the first failures with their
// wall-clock times (to hold against the proxy's log).
func (r flowResult) expectNoFailures(t *testing.T, what string) {
	t.Helper()
	r.expectFailuresAtMost(t, what, 0)
}

// expectFailuresAtMost is expectNoFailures allowing up to n failed requests
// per flow, none of them refused.
func (r flowResult) expectFailuresAtMost(t *testing.T, what string, n int) {
	t.Helper()
	for i, s := range []*echo.Summary{r.tcp, r.udp} {
		if s.Failed > n || s.Errors["refused"] > 0 {
			t.Errorf("%s: %s: %d of %d requests failed (%v); longest gap without a reply %v, from %s",
				what, s.Target, s.Failed, s.OK+s.Failed, s.Errors, msDuration(s.LongestGapMS),
				r.started[i].Add(msDuration(s.LongestGapAtMS)).UTC().Format("15:04:05.000"))
			for _, res := range firstN(s.Results, 5) {
				at := r.started[i].Add(msDuration(res.AtMS))
				t.Logf("  request at %s, after %.0f ms: %s", at.UTC().Format("15:04:05.000"), res.RTTMS, res.Error)
			}
		}
		if s.OK < flowMinReplies {
			t.Errorf("%s: %s: only %d requests answered: not much of a flow", what, s.Target, s.OK)
		}
	}
}

// logFault logs a fault's numbers, and one summary line for the README's
// table "fault | recovery time | failed connections" (recovery < 0: none
// was needed).
func logFault(t *testing.T, fault string, recovery time.Duration, r flowResult) {
	t.Helper()
	rec := "-"
	if recovery >= 0 {
		rec = recovery.Round(time.Millisecond).String()
	}
	t.Logf("%s: recovery %s; %s", fault, rec, r)
	t.Logf("FAULT | %s | %s | %d | longest gap %v", fault, rec, r.failed(), r.gap())
}

// healthPort is where the proxy serves /healthz and /livez: the default
// --healthz-bind-address.
const healthPort = "10256"

// health GETs path (/healthz, /livez) of the proxy in the node namespace
// and returns the status code and body.
func (e *env) health(ctx context.Context, path string) (int, string, error) {
	return getIn(ctx, e.sb, sandbox.Node, "http://"+hostPort("127.0.0.1", healthPort)+path)
}

// getIn GETs url from inside namespace ns.
func getIn(ctx context.Context, sb *sandbox.Sandbox, ns, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := httpClientIn(sb.NS(ns)).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64*1024))
	return resp.StatusCode, string(body), err
}

// procMemory reads the peak and current resident set sizes (VmHWM, VmRSS)
// of process pid, in KiB.
func procMemory(pid int) (hwm, rss int, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	hwm, rss = -1, -1
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, k, err)
		}
		if k == "VmHWM" {
			hwm = n
		} else {
			rss = n
		}
	}
	if hwm < 0 || rss < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status has no VmHWM or VmRSS", pid)
	}
	return hwm, rss, nil
}

// nftScript runs an nft script (nft -f -) in the node namespace.
func (e *env) nftScript(ctx context.Context, script string) error {
	cmd := e.sb.Command(ctx, sandbox.Node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft -f - <<%q: %w: %s", script, err, out)
	}
	return nil
}

// render returns what `kube-nftproxy render` prints for the env's state
// (the proxy's flags that shape the rules, as startProxy gives them).
func (e *env) render(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, proxyBin, "render", "--proxy-mode=nftables", "--state", e.state,
		"--hostname-override", nodeName, "--cluster-cidr", clusterCIDRs())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render: %v: %s", err, stderr.String())
	}
	return string(out)
}

// emptyChain is a chain a sync emptied (only its comment is left), which
// the proxy deletes about a second later.
var emptyChain = regexp.MustCompile(`chain (KUBE-[A-Z0-9-]+) \{\n\s*comment "[^"]*"\n\s*\}`)

// waitStaleChainsDeleted polls until the node's ruleset holds no emptied
// chain, and fails the test if that takes over 5s.
func (e *env) waitStaleChainsDeleted(t *testing.T) {
	t.Helper()
	e.proxy.poll(t, 5*time.Second, "the emptied chains to be deleted", func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		if m := emptyChain.FindAllStringSubmatch(string(out), -1); len(m) > 0 {
			return fmt.Errorf("%d emptied chains left, such as %s", len(m), m[0][1])
		}
		return nil
	})
}

// waitRendered polls until `nft list ruleset` of the node equals what
// render prints for the same state (normalized), and returns how long that
// took. It fails the test after timeout, saying what still differs.
func (e *env) waitRendered(t *testing.T, timeout time.Duration, what string) time.Duration {
	t.Helper()
	want := testutil.SortedListing(e.render(t))
	t0 := time.Now()
	e.proxy.poll(t, timeout, what+": nft list ruleset equal to render", func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		if d := testutil.ListingDiff(testutil.SortedListing(string(out)), want, "the kernel", "render"); d != "" {
			return errors.New(d)
		}
		return nil
	})
	return time.Since(t0)
}

// kill ends the proxy with SIGKILL and waits for it; the end of the test
// then does not judge its exit.
func (p *proxy) kill(t *testing.T) {
	t.Helper()
	p.exitJudged.Store(true)
	if err := p.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the proxy: %v", err)
	}
	select {
	case <-p.proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not die of SIGKILL within 10s")
	}
}

// stop ends the proxy with SIGTERM; it must exit 0.
func (p *proxy) stop(t *testing.T) {
	t.Helper()
	if err := p.proc.Stop(10 * time.Second); err != nil {
		t.Fatalf("proxy on SIGTERM: %v (want exit status 0)", err)
	}
}

// resetProxy stops the proxy (SIGTERM, exit 0), deletes its tables, and
// starts it again on the env's state with args: a clean start after a step
// that left the tables in a state the proxy did not repair.
func (e *env) resetProxy(t *testing.T, args ...string) {
	t.Helper()
	if !e.proxy.proc.Exited() {
		e.proxy.stop(t)
	}
	var script strings.Builder
	for _, table := range nftTables(t, e.sb) {
		// Not the lock's table: it goes with its holder, which no one else may delete.
		if f := strings.Fields(table); len(f) == 3 && strings.HasPrefix(f[2], "kube-nftproxy") && f[2] != "kube-nftproxy-lock" {
			fmt.Fprintf(&script, "delete %s\n", table)
		}
	}
	if err := e.nftScript(t.Context(), script.String()); err != nil {
		t.Fatal(err)
	}
	expected := e.proxy.expectedErrors
	e.proxy = startProxy(t, e.sb, e.state, args...)
	e.proxy.expectedErrors = expected
}
