package proxy

// Faults of the proxy's listeners and settings (issue "Never stuck, never
// silent", faults 2 and 5): a flood of idle keep-alive connections to the
// health port must not take the file descriptors the proxy needs, and sync
// periods that would make it spin must be refused at start.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	// listenFDLimit is the proxy's open file limit in the flood test
	// (soft and hard, so that Go cannot raise it): low, so that a few
	// hundred connections reach it.
	listenFDLimit = 256
	// listenFlood is how many idle keep-alive connections flood the
	// health port: over twice the fd limit.
	listenFlood = 600
	// floodAddedIP is the ClusterIP of the Service added during the flood.
	floodAddedIP = "10.96.0.77"
)

// TestFaultListenFlood runs the proxy with an open file limit of
// listenFDLimit and floods its health port (reachable from the network in
// kube-proxy's default 0.0.0.0:10256) with listenFlood keep-alive
// connections, each sending one request and then idling. While they are
// held open: /healthz and /metrics answer, the proxy's open descriptors
// stay under its limit, a Service added to the state directory is
// programmed and carries traffic, and the example's Services keep working.
// Before the fix the flood took every descriptor: /healthz and /metrics
// stopped answering, and the state directory could no longer be read.
func TestFaultListenFlood(t *testing.T) {
	t.Parallel()
	e := newFDLimitedEnv(t, listenFDLimit)
	e.waitRendered(t, 10*time.Second, "before the flood")
	f := e.startExampleFlows(t)

	fl := floodIdle(t, e.sb, hostPort("127.0.0.1", healthPort), "/healthz", listenFlood)
	fds := openFDs(t, e.proxy.proc.Pid())
	t.Logf("flood of %d connections: %s; the proxy has %d open descriptors (limit %d)", listenFlood, fl, fds, listenFDLimit)
	if fds >= listenFDLimit-16 {
		t.Errorf("the proxy has %d open descriptors during the flood, near its limit of %d: nothing left for its own work", fds, listenFDLimit)
	}

	healthAnswered := expectAnswers(t, e, "/healthz", "http://"+hostPort("127.0.0.1", healthPort)+"/healthz", "")
	expectAnswers(t, e, "/metrics", "http://127.0.0.1:10249/metrics", "kubenftproxy_http_connections_dropped_total")

	t0 := time.Now()
	writeAtomic(t, e.state, "flood-added.yaml", floodAddedService())
	e.waitRendered(t, 15*time.Second, "a Service added during the flood")
	programmed := time.Since(t0)
	sum := e.requests(t, podC.Name, "tcp", hostPort(floodAddedIP, webPort), requestsPerCheck)
	expectBackends(t, "the Service added during the flood", sum, podA.Name)
	t.Logf("during the flood: /healthz answered after %v, the added Service was programmed %v after it was written",
		healthAnswered.Round(10*time.Microsecond), programmed.Round(time.Millisecond))

	res := f.stop(t)
	logFault(t, fmt.Sprintf("health port flooded with %d idle keep-alive connections (fd limit %d)", listenFlood, listenFDLimit), -1, res)
	res.expectNoFailures(t, "health port flood")
	e.proxy.checkRunning(t)
}

// newFDLimitedEnv is newEnv (pods a, b and c, the example state) with the
// proxy run under `prlimit --nofile=limit:limit`.
func newFDLimitedEnv(t *testing.T, limit int) *env {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("skipping: needs prlimit (util-linux) to lower the proxy's open file limit")
	}
	e := &env{sb: newSandbox(t, []sandbox.Pod{podA, podB, podC}), state: t.TempDir()}
	copyDir(t, exampleState, e.state)
	e.startServer(t, podA)
	e.startServer(t, podB)
	nofile := fmt.Sprintf("--nofile=%d:%d", limit, limit)
	e.proxy = launchProxy(t, e.sb, 5*time.Second, append([]string{"prlimit", nofile, "--"}, proxyCommand(e.state)...)...)
	e.proxy.waitLog(t, 30*time.Second, "the proxy's first sync", func(lines []string) bool { return countSyncs(lines) > 0 })
	return e
}

// floodStats is what the flood's connections saw.
type floodStats struct {
	mu                                  sync.Mutex
	answered, closed, silent, notDialed int
	took                                time.Duration
}

func (s *floodStats) String() string {
	return fmt.Sprintf("%d answered, %d closed by the server before an answer, %d without an answer within 1s, %d not connected, in %v",
		s.answered, s.closed, s.silent, s.notDialed, s.took.Round(time.Millisecond))
}

// floodIdle opens n connections from the node namespace to addr, 16 at a
// time, each sending one keep-alive GET of path and reading the answer for
// at most a second, and holds them open until the test ends.
func floodIdle(t *testing.T, sb *sandbox.Sandbox, addr, path string, n int) *floodStats {
	t.Helper()
	stats := &floodStats{}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range jobs {
				c, outcome := idleConn(t.Context(), sb, addr, path)
				stats.mu.Lock()
				*outcome(stats)++
				stats.mu.Unlock()
				if c != nil {
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	stats.took = time.Since(t0)
	return stats
}

// idleConn opens one flood connection and says what it saw; the connection
// is returned, to be held, unless it could not be opened.
func idleConn(ctx context.Context, sb *sandbox.Sandbox, addr, path string) (net.Conn, func(*floodStats) *int) {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := dialInNetNS(dctx, sb.NS(sandbox.Node), "tcp", addr)
	if err != nil {
		return nil, func(s *floodStats) *int { return &s.notDialed }
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return c, func(s *floodStats) *int { return &s.closed }
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return c, func(s *floodStats) *int { return &s.silent }
	case err != nil:
		return c, func(s *floodStats) *int { return &s.closed }
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c, func(s *floodStats) *int { return &s.answered }
}

// expectAnswers polls url from the node namespace for up to 5 s until it
// answers 200 (with want in its body, if set), and returns how long that
// took; it fails the test if it never does.
func expectAnswers(t *testing.T, e *env, what, url, want string) time.Duration {
	t.Helper()
	t0 := time.Now()
	var last error
	err := sandbox.Poll(t.Context(), 5*time.Second, 50*time.Millisecond, func(ctx context.Context) error {
		code, body, err := getIn(ctx, e.sb, sandbox.Node, url)
		switch {
		case err != nil:
			last = err
		case code != http.StatusOK:
			last = fmt.Errorf("status %d", code)
		case want != "" && !strings.Contains(body, want):
			last = fmt.Errorf("no %s in the answer", want)
		default:
			return nil
		}
		return last
	})
	if err != nil {
		t.Errorf("%s during the flood: no answer within 5s (last: %v)", what, last)
	}
	return time.Since(t0)
}

// openFDs counts the open file descriptors of process pid.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// floodAddedService is a Service with one endpoint, pod-a, added to the
// state directory during the flood.
func floodAddedService() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: flood-added, namespace: default}
spec:
  selector: {app: flood-added}
  clusterIP: %[1]s
  clusterIPs: [%[1]s]
  ports:
  - {name: http, protocol: TCP, port: %[2]s, targetPort: %[3]d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: flood-added-ipv4
  namespace: default
  labels: {kubernetes.io/service-name: flood-added}
addressType: IPv4
ports:
- {name: http, protocol: TCP, port: %[3]d}
endpoints:
- addresses: [%[4]s]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: %[5]s
`, floodAddedIP, webPort, podTCPPort, podA.IPv4, nodeName)
}

// TestFaultSyncPeriodsRefused runs the proxy with sync periods that would
// make it sync without pause (zero, negative, from flags or --config): it
// must exit non-zero at once with kube-proxy's rule and the setting's name,
// and --write-config-to must write nothing. Before the fix, zero periods
// ran 350k syncs in 6 s. Each runs in a network namespace of its own that
// goes away with it (unshare --net), so that a proxy that does not exit
// touches nothing.
func TestFaultSyncPeriodsRefused(t *testing.T) {
	t.Parallel()
	needRoot(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	body := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables:\n  syncPeriod: -1s\n"
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(dir, "written.yaml")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"both zero", []string{"--iptables-sync-period=0s", "--iptables-min-sync-period=0s"}, "--iptables-sync-period 0s: must be greater than 0"},
		{"negative min", []string{"--iptables-min-sync-period=-1s"}, "--iptables-min-sync-period -1s: must be greater than or equal to 0"},
		{"negative in --config", []string{"--config", config}, "nftables.syncPeriod -1s: must be greater than 0"},
		{"zero with --write-config-to", []string{"--iptables-sync-period=0s", "--write-config-to", written}, "--iptables-sync-period 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runProxyOnce(t, dir, tc.args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
				t.Errorf("the proxy ended with %v; want a non-zero exit status", err)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("the proxy's message does not say %q; output:\n%s", tc.want, out)
			}
			if _, err := os.Stat(written); err == nil {
				t.Errorf("--write-config-to wrote %s with a refused setting", written)
			}
		})
	}
}

// syncedRE matches the proxy's sync lines.
var syncedRE = regexp.MustCompile(`\] "synced"`)

// runProxyOnce runs the proxy on a copy of the example state in a network
// namespace of its own, for at most 10 s, and returns its output and how
// it ended (killed: the context's error).
func runProxyOnce(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	state := filepath.Join(dir, "state")
	if _, err := os.Stat(state); err != nil {
		if err := os.Mkdir(state, 0o755); err != nil {
			t.Fatal(err)
		}
		copyDir(t, exampleState, state)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--net", proxyBin, "--proxy-mode=nftables", "--state", state,
		"--hostname-override", nodeName, "--cluster-cidr", clusterCIDRs(), "--healthz-bind-address", "", "--metrics-bind-address", ""}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		syncs := len(syncedRE.FindAllIndex(out.Bytes(), -1))
		return out.String(), fmt.Errorf("still running after 10s (killed), %s syncs logged: %w", strconv.Itoa(syncs), ctx.Err())
	}
	return out.String(), err
}
