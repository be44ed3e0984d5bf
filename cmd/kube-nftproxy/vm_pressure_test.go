package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// The node-under-pressure tests: the real command in nftables mode in the
// sandbox (newSandboxEnv, the state of testdata/ipvs-traffic), in the VM
// tier only: they change what is global to the node (nf_conntrack_max,
// the clock).

// nftModeFlags run the proxy in nftables mode with a short sync period,
// leaving nf_conntrack_max alone.
var nftModeFlags = []string{"--proxy-mode", "nftables", "--iptables-sync-period", "2s", "--conntrack-max-per-core", "0"}

// requireGuest skips outside the VM tier's guest.
func requireGuest(t *testing.T, what string) {
	t.Helper()
	if !vmguest.InGuest() {
		t.Skipf("%s, global to the node: runs in the VM tier only (make vm-test-6.1 VM_PKGS=./cmd/kube-nftproxy VM_FLAGS=\"-run '^%s$'\")", what, t.Name())
	}
}

// newNFTablesEnv is the sandbox with the proxy started in nftables mode
// and answering on the web Service.
func newNFTablesEnv(t *testing.T) *trafficEnv {
	e := newSandboxEnv(t, "testdata/ipvs-traffic")
	e.mode = nftModeFlags
	e.startProxy()
	e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: 1}, 30*time.Second,
		backendsAndSources(1, nil, "", nil))
	return e
}

// extraService is a ClusterIP Service on port 80 to both pods' 8080, in
// a state file of its own.
func extraService(name, ip string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: ClusterIP
  selector: {app: web}
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv4]
  clusterIP: %[2]s
  clusterIPs: [%[2]s]
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-ipv4
  namespace: default
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports:
- {name: http, protocol: TCP, port: 8080}
endpoints:
- addresses: [%[3]s]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-1
- addresses: [%[4]s]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-1
`, name, ip, podA, podB)
}

// addService writes extraService(name, ip) to the state and returns how
// long the proxy took to program it (its address in the node's ruleset).
func (e *trafficEnv) addService(name, ip string, timeout time.Duration) time.Duration {
	e.t.Helper()
	elem := ip + " . tcp . 80"
	if out, err := e.sb.Exec(e.t.Context(), sandbox.Node, "nft", "list", "ruleset"); err != nil || strings.Contains(string(out), elem) {
		e.t.Fatalf("%q in the ruleset before Service %s was added (%v)", elem, name, err)
	}
	t0 := time.Now()
	e.writeState(name+".yaml", extraService(name, ip))
	if err := sandbox.Poll(e.t.Context(), timeout, 50*time.Millisecond, func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err == nil && !strings.Contains(string(out), elem) {
			err = fmt.Errorf("no %q in the ruleset", elem)
		}
		return err
	}); err != nil {
		e.t.Fatalf("Service %s not programmed: %v", name, err)
	}
	return time.Since(t0)
}

// keptConn is one HTTP/1.1 connection held open from a sandbox namespace:
// it goes on working while no new connection can be made there.
type keptConn struct {
	c net.Conn
	r *bufio.Reader
}

// keep connects from ns to addr and gets path at once: our servers close
// a connection whose first request does not come within 5 s, and one
// idle for 30 s after that.
func (e *trafficEnv) keep(ns, addr, path string) *keptConn {
	e.t.Helper()
	var c net.Conn
	err := netns.Do("/run/netns/"+e.sb.NS(ns), func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		e.t.Fatalf("connecting from %s to %s: %v", ns, addr, err)
	}
	e.t.Cleanup(func() { c.Close() })
	k := &keptConn{c: c, r: bufio.NewReader(c)}
	if code, body, err := k.get(path); err != nil || code != http.StatusOK {
		e.t.Fatalf("%s%s from %s: %d %v %s", addr, path, ns, code, err, body)
	}
	return k
}

// get sends a GET of path over the connection (within the servers' idle
// timeout of the last one, or the server closes it).
func (k *keptConn) get(path string) (int, string, error) {
	if err := k.c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return 0, "", err
	}
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: kept\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric reads one series (name with its labels) from /metrics.
func (k *keptConn) metric(series string) (float64, error) {
	code, body, err := k.get("/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/metrics: %d", code)
	}
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("no %s in /metrics", series)
	}
	return strconv.ParseFloat(m[1], 64)
}

// setGlobal writes a sysctl of the guest's initial network namespace and
// puts the value back at the end of the test.
func setGlobal(t *testing.T, key, value string) {
	t.Helper()
	p := "/proc/sys/" + key
	was, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(p, was, 0o644); err != nil {
			t.Errorf("restoring %s: %v", key, err)
		}
	})
}

// runFill is the echo helper's "fill" mode: connections to addr (a line
// server), each answered once (so established and assured in conntrack,
// which cannot evict them early), until one fails. It prints "held N:
// ERR", holds them until stdin ends, then resets them all (a reset flow
// expires in 10 s, a closed one in TIME_WAIT's 2 min).
func runFill(addr string) int {
	var conns []net.Conn
	var failure error
	for failure == nil && len(conns) < 4096 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			failure = err
			break
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintln(c, "fill"); err != nil {
			failure = err
		} else if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			failure = err
		}
	}
	fmt.Printf("held %d: %v\n", len(conns), failure)
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	return 0
}

// filler is a running "fill" helper.
type filler struct {
	p    *sandbox.Process
	in   io.WriteCloser
	held int
	err  string
}

// fill fills the conntrack table of the node with connections from the
// client to addr, until a new one fails.
func (e *trafficEnv) fill(addr string) *filler {
	e.t.Helper()
	p, in, out := e.startHelper(sandbox.Client, "fill", addr)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		e.t.Fatalf("fill: %v", err)
	}
	f := &filler{p: p, in: in}
	if _, err := fmt.Sscanf(line, "held %d:", &f.held); err != nil {
		e.t.Fatalf("fill: %q: %v", line, err)
	}
	_, f.err, _ = strings.Cut(strings.TrimSpace(line), ": ")
	return f
}

// TestVMConntrackFull fills the node's conntrack table (nf_conntrack_max
// set to 256 for the test) with established connections through a
// Service until a new one fails: the proxy warns once, its gauges say the
// table is full (read over a connection made before), and it goes on
// syncing (a Service added meanwhile is programmed). The connections
// reset, the proxy says the table has room again, and new connections
// through both Services work.
func TestVMConntrackFull(t *testing.T) {
	requireGuest(t, "sets nf_conntrack_max")
	const limit = 256
	setGlobal(t, "net/netfilter/nf_conntrack_max", strconv.Itoa(limit))
	e := newNFTablesEnv(t)
	metrics := e.keep(sandbox.Node, metricsAddr, "/metrics")
	if n, err := metrics.metric("kubenftproxy_conntrack_entries_limit"); err != nil || n != limit {
		t.Fatalf("kubenftproxy_conntrack_entries_limit %v, %v; want %d", n, err, limit)
	}
	mark := e.logs.mark()
	t0 := time.Now()
	f := e.fill("10.96.0.30:81")
	t.Logf("held %d connections through 10.96.0.30:81 in %v; then %s", f.held, time.Since(t0).Round(time.Millisecond), f.err)
	if f.held < limit*3/4 || f.err == "<nil>" {
		t.Fatalf("held %d connections, then %s: the table did not fill", f.held, f.err)
	}
	entries := e.waitReported(metrics, mark, "conntrack table nearly full", 3*10*time.Second,
		func(n float64) bool { return n >= limit*98/100 })
	t.Logf("reported after %v: entries %v of %d; %q", time.Since(t0).Round(time.Millisecond), entries, limit,
		e.logs.since(mark, "conntrack table nearly full"))

	// Syncing goes on: netlink needs no conntrack entry.
	syncs := e.syncs.Load()
	took := e.addService("second", "10.96.0.80", 10*time.Second)
	t.Logf("a Service added with the table full, programmed in %v", took.Round(time.Millisecond))
	if err := sandbox.Poll(t.Context(), 5*time.Second, 50*time.Millisecond, func(context.Context) error {
		if e.syncs.Load() == syncs {
			return fmt.Errorf("no sync logged for the Service added")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	// The pressure goes: the helper resets its connections and exits,
	// the reset flows expire, the proxy says so.
	t1 := time.Now()
	f.in.Close()
	select {
	case <-f.p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the fill helper did not exit at the end of its input")
	}
	e.waitReported(metrics, mark, "conntrack table has room again", 4*time.Minute, func(float64) bool { return true })
	t.Logf("room again after %v: %q", time.Since(t1).Round(time.Millisecond), e.logs.since(mark, "conntrack table has room again"))
	if n := len(e.logs.since(mark, "conntrack table nearly full")); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
	e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: "10.96.0.80:80", Count: 2}, 10*time.Second,
		backendsAndSources(2, nil, "", nil))
	if _, err := e.hold(sandbox.Client, "10.96.0.30:81").ask("after"); err != nil {
		t.Errorf("a new connection to 10.96.0.30:81: %v", err)
	}
}

// waitReported waits until the proxy has logged msg after mark and
// accept takes kubenftproxy_conntrack_entries, read over k (each reading
// keeps k from idling out), and returns the last value read.
func (e *trafficEnv) waitReported(k *keptConn, mark int, msg string, timeout time.Duration, accept func(float64) bool) float64 {
	e.t.Helper()
	var entries float64
	if err := sandbox.Poll(e.t.Context(), timeout, 200*time.Millisecond, func(context.Context) error {
		var err error
		switch entries, err = k.metric("kubenftproxy_conntrack_entries"); {
		case err != nil:
			return err
		case !accept(entries):
			return fmt.Errorf("kubenftproxy_conntrack_entries %v", entries)
		case len(e.logs.since(mark, msg)) == 0:
			return fmt.Errorf("kubenftproxy_conntrack_entries %v, no %q logged", entries, msg)
		}
		return nil
	}); err != nil {
		e.t.Fatalf("waiting for %q: %v", msg, err)
	}
	return entries
}

// healthAnswer is what /healthz and /livez say that the test reads.
type healthAnswer struct {
	Healthy bool `json:"healthy"`
}

// checkHealth fails t unless /healthz and /livez answer 200, healthy.
func checkHealth(t *testing.T, k *keptConn, when string) {
	t.Helper()
	for _, path := range []string{"/healthz", "/livez"} {
		code, body, err := k.get(path)
		var a healthAnswer
		if err == nil {
			err = json.Unmarshal([]byte(body), &a)
		}
		if err != nil || code != http.StatusOK || !a.Healthy {
			t.Errorf("%s: %s: %d %s (%v)", when, path, code, body, err)
		}
	}
}

// TestVMClockStep steps the guest's wall clock an hour forward, then two
// hours back, with the proxy running: after each step /healthz and /livez
// stay 200 and healthy, a Service added is programmed within seconds, the
// periodic sync goes on, and nothing is logged as an error.
func TestVMClockStep(t *testing.T) {
	requireGuest(t, "steps the clock")
	e := newNFTablesEnv(t)
	start := time.Now()
	t.Cleanup(func() {
		if err := setClock(start.Add(time.Since(start))); err != nil { // the monotonic clock did not step
			t.Error(err)
		}
	})
	health := e.keep(sandbox.Node, healthz, "/healthz")
	metrics := e.keep(sandbox.Node, metricsAddr, "/metrics")
	const syncCount = `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	usual := e.addService("before", "10.96.0.70", 10*time.Second)
	t.Logf("a Service programmed in %v before any step", usual.Round(time.Millisecond))
	for i, step := range []time.Duration{time.Hour, -2 * time.Hour} {
		mark := e.logs.mark()
		if err := setClock(time.Now().Add(step)); err != nil {
			t.Fatal(err)
		}
		checkHealth(t, health, fmt.Sprintf("right after the step %v", step))
		// A timer or an age on the wall clock would be off by the step,
		// an hour: 10 s tells that from a busy machine.
		took := e.addService(fmt.Sprintf("after-%d", i), fmt.Sprintf("10.96.0.%d", 71+i), 10*time.Second)
		t.Logf("step %v: a Service programmed in %v (%v before the steps)", step, took.Round(time.Millisecond), usual.Round(time.Millisecond))
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: fmt.Sprintf("10.96.0.%d:80", 71+i), Count: 2}, 10*time.Second,
			backendsAndSources(2, nil, "", nil))
		// Two more periodic syncs (every 2 s), within 4 periods.
		n0, err := metrics.metric(syncCount)
		if err != nil {
			t.Fatal(err)
		}
		if err := sandbox.Poll(t.Context(), 4*2*time.Second, 100*time.Millisecond, func(context.Context) error {
			n, err := metrics.metric(syncCount)
			if err == nil && n < n0+2 {
				err = fmt.Errorf("%s %v, was %v", syncCount, n, n0)
			}
			return err
		}); err != nil {
			t.Errorf("step %v: the periodic sync stopped: %v", step, err)
		}
		checkHealth(t, health, fmt.Sprintf("after the step %v and two syncs", step))
		if errs := e.logs.since(mark, "node: E"); len(errs) > 0 {
			t.Errorf("step %v: errors logged: %q", step, errs)
		}
		t.Logf("step %v: warnings: %q", step, e.logs.since(mark, "node: W"))
	}
}

// setClock sets the guest's wall clock.
func setClock(to time.Time) error {
	tv := unix.NsecToTimeval(to.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return fmt.Errorf("settimeofday: %w", err)
	}
	return nil
}
