package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	// rewrites is how many times the load Services' endpoints change
	// under the traffic loops.
	rewrites = 3
	// loopLimit bounds the traffic loops, which the test stops with
	// SIGINT once the last rewrite is synced.
	loopLimit = time.Minute
)

// TestSyncUnderLoad checks that syncs are atomic: with 1,000 more Services
// programmed, connections to the example's Services from tight loops never
// fail while the endpoints of all the other Services are rewritten, again
// and again, each rewrite one sync.
//
// The TCP loop runs in pod-c, which backs nothing. From an endpoint pod
// (pod-a), a tight TCP loop through its own Service loses a SYN now and
// then even when no rule changes at all: the pod, server of half of its own
// connections, refuses some SYNs in TIME-WAIT (its TcpExtPAWSTimewait and
// TcpExtTCPSynRetrans count about 1% of the connects) and about one connect
// in 5,000 misses the loop's 1 s timeout. That says nothing about the
// proxy. UDP keeps no such state, so the UDP loop runs in pod-b, half of it
// hairpinned.
func TestSyncUnderLoad(t *testing.T) {
	t.Parallel()
	needRoot(t)
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{
		"load-services.yaml":       loadServices(loadServiceCount),
		"load-endpointslices.yaml": loadSlices(loadServiceCount, loadPortBase),
	}})
	e.expectLoadPort(t, loadPortBase)

	loops := []*trafficLoop{
		e.startLoop(t, podC.Name, "tcp", hostPort(webClusterIPv4, webPort)),
		e.startLoop(t, podB.Name, "udp", hostPort(dnsClusterIP, dnsPort)),
	}
	for i := 1; i <= rewrites; i++ {
		port := loadPortBase + i
		before := e.proxy.syncs()
		writeAtomic(t, e.state, "load-endpointslices.yaml", loadSlices(loadServiceCount, port))
		e.proxy.waitLog(t, 30*time.Second, fmt.Sprintf("the sync of rewrite %d (port %d)", i, port), func(lines []string) bool {
			return countSyncs(lines) > before
		})
		e.expectLoadPort(t, port)
	}
	for _, l := range loops {
		l.stop(t)
	}
	for _, l := range loops {
		sum := l.wait(t)
		t.Logf("%s: %d requests answered (%v), %d failed, in %.0f ms", l.target, sum.OK, sum.Backend, sum.Failed, sum.ElapsedMS)
		if sum.Failed > 0 {
			t.Errorf("%s: %d requests failed during the syncs: %v", l.target, sum.Failed, sum.Errors)
			// With wall-clock times, to hold against the proxy's log.
			for _, r := range firstN(sum.Results, 5) {
				at := l.started.Add(time.Duration(r.AtMS * float64(time.Millisecond)))
				t.Logf("  request at %s, after %.0f ms: %s", at.UTC().Format("15:04:05.000"), r.RTTMS, r.Error)
			}
		}
		if sum.OK < 100 {
			t.Errorf("%s: only %d requests answered: not much of a load", l.target, sum.OK)
		}
	}
	e.proxy.checkRunning(t)
}

var loadDNATRE = regexp.MustCompile(`(?m)^\s*meta l4proto tcp dnat to 10\.244\.0\.1[01]:(\d+)$`)

// expectLoadPort checks in the node's ruleset that the load Services'
// endpoints, and nothing else on the load ports, are on port.
func (e *env) expectLoadPort(t *testing.T, port int) {
	t.Helper()
	e.expectLoadPorts(t, map[int]int{port: loadServiceCount})
}

// expectLoadPorts checks in the node's ruleset that the load Services'
// endpoints (pod-a and pod-b each) are on the ports of want, as many
// Services on each port as it says, and nothing else is on a load port.
func (e *env) expectLoadPorts(t *testing.T, want map[int]int) {
	t.Helper()
	if d := loadPortsDiff(e.nftRuleset(t), want); d != "" {
		t.Error(d)
	}
}

// loadPortsDiff is expectLoadPorts' check of ruleset: "" if it holds.
func loadPortsDiff(ruleset string, want map[int]int) string {
	ports := map[string]int{}
	for _, m := range loadDNATRE.FindAllStringSubmatch(ruleset, -1) {
		if m[1] != fmt.Sprint(podTCPPort) {
			ports[m[1]]++
		}
	}
	w := map[string]int{}
	for port, n := range want {
		w[fmt.Sprint(port)] = 2 * n
	}
	if !maps.Equal(ports, w) {
		return fmt.Sprintf("dnat rules of the load Services by endpoint port: %v, want %v", ports, w)
	}
	return ""
}

// trafficLoop is `e2e-agent loop` running in the background.
type trafficLoop struct {
	target  string
	proc    *sandbox.Process
	stdout  bytes.Buffer
	stderr  *lineLog
	started time.Time
}

// startLoop starts `e2e-agent loop` from ns to addr, bounded by loopLimit;
// extra flags come last and so override the defaults.
func (e *env) startLoop(t *testing.T, ns, proto, addr string, extra ...string) *trafficLoop {
	t.Helper()
	l := &trafficLoop{target: fmt.Sprintf("%s from %s to %s", proto, ns, addr)}
	args := append([]string{agentBin, "loop", "--" + proto, addr, "--duration", loopLimit.String()}, extra...)
	cmd := e.sb.Command(t.Context(), ns, args...)
	cmd.Stdout = &l.stdout
	l.stderr = &lineLog{prefix: ns + "/loop: ", logf: t.Logf}
	cmd.Stderr = l.stderr
	proc, err := e.sb.StartCmd(ns, cmd)
	if err != nil {
		t.Fatal(err)
	}
	l.proc, l.started = proc, time.Now()
	return l
}

// stop ends the loop with SIGINT, which makes it print its summary as
// usual; the loop must still be running.
func (l *trafficLoop) stop(t *testing.T) {
	t.Helper()
	if l.proc.Exited() {
		t.Fatalf("%s: the loop ended early: %v; output %s", l.target, l.proc.Wait(), l.stdout.Bytes())
	}
	if err := l.proc.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
}

// awaitReplies waits until the loop, started with --announce n, has had n
// replies: a flow judged by its replies must have carried some first, which
// on a loaded machine can take longer than the fault it surrounds.
func (l *trafficLoop) awaitReplies(t *testing.T, n int) {
	t.Helper()
	want := fmt.Sprintf("%d replies", n)
	err := sandbox.Poll(t.Context(), 30*time.Second, 20*time.Millisecond, func(context.Context) error {
		if slices.Contains(l.stderr.lines(), want) {
			return nil
		}
		if l.proc.Exited() {
			return fmt.Errorf("the loop ended: %v", l.proc.Wait())
		}
		return errors.New("fewer replies so far")
	})
	if err != nil {
		t.Errorf("%s: waiting for %s: %v", l.target, want, err)
	}
}

// wait waits for the loop to end and returns its summary.
func (l *trafficLoop) wait(t *testing.T) *echo.Summary {
	t.Helper()
	select {
	case <-l.proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the loop did not end", l.target)
	}
	err := l.proc.Wait() // exit status 1 for failed requests: judged below
	var sum echo.Summary
	if jerr := json.Unmarshal(l.stdout.Bytes(), &sum); jerr != nil {
		t.Fatalf("%s: %v; output %q: %v", l.target, err, l.stdout.Bytes(), jerr)
	}
	return &sum
}

func firstN[T any](s []T, n int) []T { return s[:min(n, len(s))] }
