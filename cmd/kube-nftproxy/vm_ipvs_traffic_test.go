package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// echoEnv makes the test binary an echo server or client (e2e/echo) instead
// of running the tests: "serve" or "client", configured by echoArgsEnv (JSON).
// The guest has no curl; the traffic tests start these in the namespaces.
const (
	echoEnv     = "KNP_TEST_ECHO"
	echoArgsEnv = "KNP_TEST_ECHO_ARGS"
)

type serveArgs struct {
	Name, TCP, UDP string
	Lines          string // a TCP address answering each line with "NAME line", for held connections
}

// runEcho runs the echo server (until SIGTERM) or one client run (its
// summary as JSON on stdout) and returns the exit status.
func runEcho(mode string) int {
	switch mode {
	case "serve":
		var a serveArgs
		if err := json.Unmarshal([]byte(os.Getenv(echoArgsEnv)), &a); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			return 2
		}
		srv, err := echo.Listen(a.Name, a.TCP, a.UDP)
		if err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			return 1
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if a.Lines != "" {
			l, err := net.Listen("tcp4", a.Lines)
			if err != nil {
				fmt.Fprintln(os.Stderr, "serve:", err)
				return 1
			}
			go func() { <-ctx.Done(); l.Close() }()
			go serveLines(a.Name, l)
		}
		if err := srv.Serve(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			return 1
		}
		return 0
	case "client":
		var cfg echo.ClientConfig
		if err := json.Unmarshal([]byte(os.Getenv(echoArgsEnv)), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			return 2
		}
		sum, err := echo.Run(context.Background(), cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			return 2
		}
		_ = json.NewEncoder(os.Stdout).Encode(sum)
		return 0
	case "get":
		// An HTTP GET of the URL in echoArgsEnv: the body on stdout.
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(os.Getenv(echoArgsEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, "get:", err)
			return 1
		}
		defer resp.Body.Close()
		_, _ = io.Copy(os.Stdout, resp.Body)
		return 0
	case "fill":
		return runFill(os.Getenv(echoArgsEnv))
	case "hold":
		// One connection to the address in echoArgsEnv, held open: each
		// line on stdin goes out, each answer (or "ERR ...") to stdout.
		c, err := net.DialTimeout("tcp", os.Getenv(echoArgsEnv), 2*time.Second)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		// At the end of stdin the connection is reset, not closed: IPVS
		// forgets a reset connection in 10 s, a closed one only after
		// TIME_WAIT (2 min), and a draining real server waits for it.
		defer func() { _ = c.(*net.TCPConn).SetLinger(0); c.Close() }()
		in, replies := bufio.NewScanner(os.Stdin), bufio.NewReader(c)
		for in.Scan() {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := fmt.Fprintln(c, in.Text()); err != nil {
				fmt.Println("ERR", err)
				continue
			}
			line, err := replies.ReadString('\n')
			if err != nil {
				fmt.Println("ERR", err)
				continue
			}
			fmt.Print(line)
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "%s=%q: want serve, client, get, hold or fill\n", echoEnv, mode)
	return 2
}

// serveLines answers every line of every connection with "name line".
func serveLines(name string, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewScanner(c)
			for r.Scan() {
				if _, err := fmt.Fprintln(c, name, r.Text()); err != nil {
					return
				}
			}
		}()
	}
}

// heldConn is a TCP connection held open by a "hold" client process.
type heldConn struct {
	in  io.WriteCloser
	out *bufio.Reader
}

// hold opens a connection from ns to addr in a helper process.
func (e *trafficEnv) hold(ns, addr string) *heldConn {
	e.t.Helper()
	_, in, out := e.startHelper(ns, "hold", addr)
	return &heldConn{in: in, out: bufio.NewReader(out)}
}

// startHelper starts the test binary in ns as the echo helper of the
// given mode with arg, and returns it with its stdin (closed when the
// test ends, which tells the helper to stop) and stdout.
func (e *trafficEnv) startHelper(ns, mode, arg string) (*sandbox.Process, io.WriteCloser, io.Reader) {
	e.t.Helper()
	cmd := e.sb.Command(e.t.Context(), ns, e.self)
	cmd.Env = append(os.Environ(), echoEnv+"="+mode, echoArgsEnv+"="+arg)
	in, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := e.sb.StartCmd(ns, cmd)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { in.Close() })
	return p, in, out
}

// ask sends msg over the held connection and returns the answering
// backend's name, or an error (after at most a few seconds).
func (h *heldConn) ask(msg string) (string, error) {
	if _, err := fmt.Fprintln(h.in, msg); err != nil {
		return "", err
	}
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() { l, err := h.out.ReadString('\n'); ch <- res{l, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			return "", r.err
		}
		name, got, _ := strings.Cut(strings.TrimSpace(r.line), " ")
		if name == "ERR" || got != msg {
			return "", fmt.Errorf("answer %q to %q", strings.TrimSpace(r.line), msg)
		}
		return name, nil
	case <-time.After(5 * time.Second):
		return "", errors.New("no answer in 5s")
	}
}

// trafficEnv is a sandbox (e2e/TOPOLOGY.md, IPv4) with the real command
// running in IPVS mode in its node namespace and echo servers in its pods.
type trafficEnv struct {
	t     *testing.T
	sb    *sandbox.Sandbox
	self  string
	proxy *sandbox.Process
	syncs *atomic.Int32 // syncs that changed something, as the proxies logged them
	logs  *logLines     // every line the processes in the sandbox logged
	state string        // the proxy's --state: a writable copy of testdata/ipvs-traffic
	// mode are the proxy's flags beyond those startProxy always gives.
	mode []string
}

// with returns the environment for a subtest: failures go to t.
func (e *trafficEnv) with(t *testing.T) *trafficEnv {
	c := *e
	c.t = t
	return &c
}

// Addresses of the topology and of testdata/ipvs-traffic.
const (
	clusterIP   = "10.96.0.10"
	dnsIP       = "10.96.0.53"
	externalIP  = "203.0.113.10"
	nodeIP      = "10.99.0.1"  // ext0, facing the client
	bridgeIP    = "10.244.0.1" // kbr0: the source of masqueraded traffic to pods
	podA        = "10.244.0.10"
	podB        = "10.244.0.11"
	clientIP    = "10.99.0.2"
	client2IP   = "10.99.0.3" // a second off-cluster client, on the client's link
	strayPort   = "9999"      // a node listener's port that is no Service port
	syncPeriod  = 5 * time.Second
	metricsAddr = "127.0.0.1:10249" // in the node namespace
	metricsURL  = "http://" + metricsAddr + "/metrics"
)

// start runs the test binary in ns as an echo server or (with a JSON
// config) the proxy; env selects which.
func (e *trafficEnv) start(ns string, env []string, args ...string) *sandbox.Process {
	e.t.Helper()
	cmd := e.sb.Command(e.t.Context(), ns, append([]string{e.self}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	w := logWriter{logf: e.t.Logf, prefix: ns + ": ", syncs: e.syncs, lines: e.logs}
	cmd.Stdout, cmd.Stderr = w, w
	p, err := e.sb.StartCmd(ns, cmd)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// logWriter passes output to t.Logf (one call per write), keeps it in
// lines and counts the proxy's syncs that changed something.
type logWriter struct {
	logf   func(string, ...any)
	prefix string
	syncs  *atomic.Int32
	lines  *logLines
}

// syncedLine is how the proxy's log (klog's text format) starts the
// message of a sync that changed something: `loop.go:281] "synced" full=...`.
const syncedLine = `] "synced" `

func (w logWriter) Write(b []byte) (int, error) {
	w.logf("%s%s", w.prefix, strings.TrimRight(string(b), "\n"))
	if w.syncs != nil {
		w.syncs.Add(int32(strings.Count(string(b), syncedLine)))
	}
	if w.lines != nil {
		w.lines.add(w.prefix, string(b))
	}
	return len(b), nil
}

// logLines keeps the lines the sandbox's processes logged, each after the
// name of its namespace.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		l.lines = append(l.lines, prefix+line)
	}
}

// mark is where the log is now: since(mark) reads what comes after.
func (l *logLines) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// since returns the lines logged after mark that contain sub.
func (l *logLines) since(mark int, sub string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines[min(mark, len(l.lines)):] {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}

func (e *trafficEnv) serve(ns string, a serveArgs) {
	e.t.Helper()
	js, _ := json.Marshal(a)
	e.start(ns, []string{echoEnv + "=serve", echoArgsEnv + "=" + string(js)})
}

// client runs one client run in ns and returns its summary.
func (e *trafficEnv) client(ctx context.Context, ns string, cfg echo.ClientConfig) (*echo.Summary, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Results == "" {
		cfg.Results = echo.ResultsAll
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("client in %s: %w", ns, err)
	}
	cmd := e.sb.Command(ctx, ns, e.self)
	cmd.Env = append(os.Environ(), echoEnv+"=client", echoArgsEnv+"="+string(js))
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("client in %s: %v: %s", ns, err, ee.Stderr)
		}
		return nil, fmt.Errorf("client in %s: %w", ns, err)
	}
	var sum echo.Summary
	if err := json.Unmarshal(out, &sum); err != nil {
		return nil, fmt.Errorf("client in %s: %q: %w", ns, out, err)
	}
	return &sum, nil
}

// eventually repeats the client run until check accepts its summary or the
// deadline passes (then the test fails with check's last complaint).
func (e *trafficEnv) eventually(ns string, cfg echo.ClientConfig, timeout time.Duration, check func(*echo.Summary) error) *echo.Summary {
	e.t.Helper()
	var (
		sum  *echo.Summary
		last error
	)
	err := sandbox.Poll(e.t.Context(), timeout, 100*time.Millisecond, func(ctx context.Context) error {
		s, err := e.client(ctx, ns, cfg)
		if err != nil {
			last = err
			return err
		}
		sum = s
		last = check(s)
		return last
	})
	if err != nil {
		e.t.Fatalf("%s -> %s %s: %v (last: %v; summary %+v)", ns, cfg.Network, cfg.Addr, err, last, sum)
	}
	return sum
}

// backendsAndSources checks that every request got an answer, that every
// backend in want answered, and that each backend saw the source wantSrc
// (or, for a backend in srcPer, that one).
func backendsAndSources(n int, want []string, wantSrc string, srcPer map[string]string) func(*echo.Summary) error {
	return func(s *echo.Summary) error {
		if s.OK != n || s.Failed != 0 {
			return fmt.Errorf("%d of %d answered, %d failed %v", s.OK, n, s.Failed, s.Errors)
		}
		for _, b := range want {
			if s.Backend[b] == 0 {
				return fmt.Errorf("%s never answered: %v", b, s.Backend)
			}
		}
		for _, r := range s.Results {
			src, _, _ := net.SplitHostPort(r.Source)
			w := wantSrc
			if p, ok := srcPer[r.Backend]; ok {
				w = p
			}
			if w != "" && src != w {
				return fmt.Errorf("%s saw source %s, want %s", r.Backend, r.Source, w)
			}
		}
		return nil
	}
}

// startProxy starts the command in the node namespace, in standalone
// mode over the state files, with e.mode's flags.
func (e *trafficEnv) startProxy() {
	e.proxy = e.start(sandbox.Node, []string{mainEnv + "=1"}, append([]string{"--state", e.state,
		"--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
		"--healthz-bind-address", healthz, "--metrics-bind-address", metricsAddr},
		e.mode...)...)
}

const healthz = "127.0.0.1:10256" // in the node namespace

// lastUpdated is the time of the running proxy's last successful sync, as
// its /healthz says in status (zero before the first; the top-level
// lastUpdated is the current time while healthy, as kube-proxy's).
func (e *trafficEnv) lastUpdated(ctx context.Context) (time.Time, error) {
	cmd := e.sb.Command(ctx, sandbox.Node, e.self)
	cmd.Env = append(os.Environ(), echoEnv+"=get", echoArgsEnv+"=http://"+healthz+"/healthz")
	out, err := cmd.Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("healthz: %w", err)
	}
	var body struct {
		Status map[string]struct {
			LastUpdated time.Time `json:"lastUpdated"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &body); err != nil {
		return time.Time{}, fmt.Errorf("healthz %q: %w", out, err)
	}
	return body.Status["IPv4"].LastUpdated, nil
}

// vsConns reads the total connection counts of the virtual servers
// (ipvsadm -Ln --stats): a virtual server deleted and re-created starts
// again from 0.
func (e *trafficEnv) vsConns() map[string]int {
	e.t.Helper()
	out, err := e.sb.Exec(e.t.Context(), sandbox.Node, "ipvsadm", "-Ln", "--stats")
	if err != nil {
		e.t.Fatalf("ipvsadm: %v", err)
	}
	conns := map[string]int{}
	for _, m := range vsStatsRE.FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(m[3])
		conns[m[1]+" "+m[2]] = n
	}
	return conns
}

var vsStatsRE = regexp.MustCompile(`(?m)^(TCP|UDP)\s+(\S+)\s+\S+\s+(\d+)`)

// writeState replaces (or adds) one state file at once: written beside it
// under a hidden name (which the proxy ignores), then renamed.
func (e *trafficEnv) writeState(name, content string) {
	e.t.Helper()
	tmp := filepath.Join(e.state, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.state, name)); err != nil {
		e.t.Fatal(err)
	}
}

// get fetches a URL from the node namespace.
func (e *trafficEnv) get(ctx context.Context, url string) (string, error) {
	cmd := e.sb.Command(ctx, sandbox.Node, e.self)
	cmd.Env = append(os.Environ(), echoEnv+"=get", echoArgsEnv+"="+url)
	out, err := cmd.Output()
	return string(out), err
}

// driftRepairs is kubenftproxy_drift_repairs_total{table} of the running proxy.
func (e *trafficEnv) driftRepairs(table string) int {
	e.t.Helper()
	out, err := e.get(e.t.Context(), metricsURL)
	if err != nil {
		e.t.Fatalf("metrics: %v", err)
	}
	m := regexp.MustCompile(`(?m)^kubenftproxy_drift_repairs_total\{table="` + regexp.QuoteMeta(table) + `"\} (\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// realServers reads the real servers of one virtual server and their
// weights from /proc/net/ip_vs (hexadecimal addresses) in the node
// namespace; ok is false when there is no such virtual server.
func (e *trafficEnv) realServers(vs netip.AddrPort) (dests map[netip.AddrPort]int, ok bool) {
	e.t.Helper()
	out, err := e.sb.Exec(e.t.Context(), sandbox.Node, "cat", "/proc/net/ip_vs")
	if err != nil {
		e.t.Fatalf("/proc/net/ip_vs: %v", err)
	}
	hex := func(ap netip.AddrPort) string {
		return fmt.Sprintf("%X:%04X", ap.Addr().AsSlice(), ap.Port())
	}
	want := hex(vs)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP"):
			if ok {
				return dests, true
			}
			if f[1] == want {
				ok, dests = true, map[netip.AddrPort]int{}
			}
		case ok && len(f) >= 4 && f[0] == "->":
			for _, a := range []string{podA + ":8081", podB + ":8081", podA + ":8080", podB + ":8080"} {
				if ap := netip.MustParseAddrPort(a); hex(ap) == f[1] {
					w, _ := strconv.Atoi(f[3])
					dests[ap] = w
				}
			}
		}
	}
	return dests, ok
}

func newTrafficEnv(t *testing.T) *trafficEnv {
	vmguest.RequireIPVS(t)
	e := newSandboxEnv(t, "testdata/ipvs-traffic")
	// The client reaches external IPs through the node, like a router
	// would; its second address is outside the LB source ranges.
	for _, c := range [][]string{{"ip", "route", "add", "203.0.113.0/24", "via", nodeIP},
		{"ip", "addr", "add", client2IP + "/24", "dev", sandbox.PodDev, "nodad"}} {
		if out, err := e.sb.Exec(t.Context(), sandbox.Client, c...); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	// A node daemon on every address: the port is no Service port.
	e.serve(sandbox.Node, serveArgs{Name: "node", TCP: "0.0.0.0:" + strayPort})
	e.mode = []string{"--proxy-mode", "ipvs", "--ipvs-sync-period", syncPeriod.String(), "--testing-ipvs-drain-check-period", "1s"}
	e.startProxy()
	return e
}

// newSandboxEnv is a sandbox (e2e/TOPOLOGY.md) with a writable copy of
// the state files of dir and echo servers in its pods (TCP 8080, UDP
// 5353, lines on 8081); the proxy is not started yet.
func newSandboxEnv(t *testing.T, dir string) *trafficEnv {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Options{Logf: t.Logf, StopTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	e := &trafficEnv{t: t, sb: sb, self: self, syncs: new(atomic.Int32), logs: &logLines{}, state: t.TempDir()}
	// The state files in a directory the test may change (the share is read-only).
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: %v", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		e.writeState(filepath.Base(f), string(b))
	}
	for _, p := range sb.Pods() {
		e.serve(p.Name, serveArgs{Name: p.Name, TCP: ":8080", UDP: ":5353", Lines: ":8081"})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range [][]string{{"ipvsadm", "-Ln"}, {"nft", "list", "ruleset"}, {"ip", "addr"}} {
				out, err := sb.Exec(context.Background(), sandbox.Node, c...)
				t.Logf("node: %v: %v\n%s", c, err, out)
			}
		}
	})
	return e
}

// TestVMIPVSTraffic sends real TCP and UDP traffic through the real
// command in IPVS mode (standalone, --state) on the VM's kernel: a node
// namespace with a pod bridge, two pods with echo servers, an off-cluster
// client (e2e/TOPOLOGY.md).
func TestVMIPVSTraffic(t *testing.T) {
	e := newTrafficEnv(t)
	start := time.Now()
	// Programmed and answering: the first run may wait for the first sync.
	e.eventually("pod-b", echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: 1}, 30*time.Second,
		backendsAndSources(1, nil, "", nil))
	t.Logf("proxy answering after %v", time.Since(start).Round(time.Millisecond))

	root := e
	step := func(name string, f func(e *trafficEnv, t *testing.T)) {
		t0 := time.Now()
		t.Run(name, func(t *testing.T) { f(root.with(t), t) })
		t.Logf("%s: %v", name, time.Since(t0).Round(time.Millisecond))
	}
	both := []string{"pod-a", "pod-b"}
	const n = 6

	step("ClusterIPFromPod", func(e *trafficEnv, t *testing.T) {
		// pod-b's own requests that land on pod-b are hairpin: masqueraded.
		e.eventually("pod-a", echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, both, "", map[string]string{"pod-a": bridgeIP, "pod-b": podA}))
		e.eventually("pod-a", echo.ClientConfig{Network: "udp", Addr: dnsIP + ":53", Count: n}, 10*time.Second,
			backendsAndSources(n, both, "", map[string]string{"pod-a": bridgeIP, "pod-b": podA}))
	})

	step("ClusterIPFromNode", func(e *trafficEnv, t *testing.T) {
		// The node's own requests leave through kbr0, masqueraded to its
		// address there.
		e.eventually(sandbox.Node, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
	})

	step("ClusterIPFromClient", func(e *trafficEnv, t *testing.T) {
		// Off-cluster: masqueraded, the pods see the node's address.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
	})

	step("NodePortFromClient", func(e *trafficEnv, t *testing.T) {
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: nodeIP + ":30080", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "udp", Addr: nodeIP + ":30053", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
	})

	step("ExternalIPFromClient", func(e *trafficEnv, t *testing.T) {
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: externalIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
	})

	step("Hairpin", func(e *trafficEnv, t *testing.T) {
		// pod-a to itself through the ClusterIP, every time (rr over two
		// endpoints: half the connections): masqueraded (KUBE-LOOP-BACK),
		// or pod-a would answer itself and the client drop the reply.
		sum := e.eventually("pod-a", echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, []string{"pod-a"}, "", map[string]string{"pod-a": bridgeIP, "pod-b": podA}))
		t.Logf("pod-a -> %s: %v", clusterIP, sum.Backend)
	})

	step("StrayPortOnVIPRefused", func(e *trafficEnv, t *testing.T) {
		// The node daemon answers on the node's address...
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: nodeIP + ":" + strayPort, Count: 1}, 10*time.Second,
			backendsAndSources(1, []string{"node"}, clientIP, nil))
		// ...but not on a ClusterIP (KUBE-IPVS-FILTER), from anywhere.
		for _, ns := range []string{sandbox.Client, "pod-a", sandbox.Node} {
			for _, vip := range []string{clusterIP, dnsIP, externalIP} {
				sum, err := e.client(t.Context(), ns, echo.ClientConfig{Network: "tcp", Addr: vip + ":" + strayPort, Count: 2, Timeout: 500 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if sum.OK != 0 {
					t.Errorf("%s -> %s:%s answered: %v", ns, vip, strayPort, sum.Backend)
				} else {
					t.Logf("%s -> %s:%s: %v", ns, vip, strayPort, sum.Errors)
				}
			}
		}
	})

	step("ClientIPAffinity", func(e *trafficEnv, t *testing.T) {
		// Every connection of one client goes to one backend.
		for _, ns := range []string{sandbox.Client, "pod-b"} {
			var first string
			for i := range 4 {
				h := e.hold(ns, "10.96.0.30:81")
				b, err := h.ask("hello-" + strconv.Itoa(i))
				if err != nil {
					t.Fatalf("%s: %v", ns, err)
				}
				h.in.Close()
				if first == "" {
					first = b
				} else if b != first {
					t.Errorf("%s: connection %d went to %s, the first to %s", ns, i, b, first)
				}
			}
			t.Logf("%s sticks to %s", ns, first)
		}
	})

	step("RestartAdoption", func(e *trafficEnv, t *testing.T) {
		// A connection held across the restart, and the virtual servers'
		// connection counters (reset if one were re-created).
		held := e.hold(sandbox.Client, "10.96.0.30:81")
		before, err := held.ask("before")
		if err != nil {
			t.Fatal(err)
		}
		var stats map[string]int
		if err := sandbox.Poll(t.Context(), 5*time.Second, 200*time.Millisecond, func(context.Context) error {
			// IPVS statistics lag up to 2s behind the traffic.
			stats = e.vsConns()
			for _, vs := range []string{"TCP " + clusterIP + ":80", "TCP " + nodeIP + ":30080", "TCP 10.96.0.30:81"} {
				if stats[vs] == 0 {
					return fmt.Errorf("%s: no connections counted yet: %v", vs, stats)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := root.proxy.Stop(10 * time.Second); err != nil {
			t.Fatalf("stopping the proxy: %v", err)
		}
		t0 := time.Now()
		syncs := e.syncs.Load()
		root.startProxy() // in the test's context, not the subtest's
		// Synced once: the new process's /healthz has a lastUpdated.
		if err := sandbox.Poll(t.Context(), 20*time.Second, 100*time.Millisecond, func(ctx context.Context) error {
			at, err := e.lastUpdated(ctx)
			if err == nil && (at.IsZero() || at.Before(t0.Add(-time.Minute))) {
				err = fmt.Errorf("no sync yet (lastUpdated %v)", at)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// Adopted: its first sync found nothing to change (the loop logs
		// "synced" only when it changed something).
		if n := e.syncs.Load(); n != syncs {
			t.Errorf("the restarted proxy changed the kernel's state on its first sync (%d change syncs logged)", n-syncs)
		}
		// Answering again and synced: a new connection works, then the
		// held one still answers, from the same backend.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: 2}, 20*time.Second,
			backendsAndSources(2, nil, bridgeIP, nil))
		t.Logf("restarted proxy answering after %v", time.Since(t0).Round(time.Millisecond))
		after, err := held.ask("after")
		if err != nil {
			t.Fatalf("held connection after the restart: %v", err)
		}
		if after != before {
			t.Errorf("held connection answered by %s before the restart, %s after", before, after)
		}
		now := e.vsConns()
		for vs, n := range stats {
			if now[vs] < n {
				t.Errorf("%s: %d connections counted before the restart, %d after: re-created", vs, n, now[vs])
			}
		}
	})

	step("LoadBalancerSourceRanges", func(e *trafficEnv, t *testing.T) {
		// lb-fw (203.0.113.20) allows 10.99.0.2 and 203.0.113.0/24;
		// lb-node (203.0.113.21) allows 10.99.0.2 and the node, 10.99.0.1.
		const lbFW, lbNode = "203.0.113.20:80", "203.0.113.21:80"
		for _, lb := range []string{lbFW, lbNode} {
			e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: lb, Count: n}, 10*time.Second,
				backendsAndSources(n, both, bridgeIP, nil))
		}
		// The node may reach lb-node (a range holds its primary IP).
		e.eventually(sandbox.Node, echo.ClientConfig{Network: "tcp", Addr: lbNode, Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
		refused := func(ns string, src netip.Addr, addr string) {
			t.Helper()
			sum, err := e.client(t.Context(), ns, echo.ClientConfig{Network: "tcp", Addr: addr, Count: 2, Timeout: 500 * time.Millisecond, SrcAddr: src})
			if err != nil {
				t.Fatal(err)
			}
			if sum.OK != 0 {
				t.Errorf("%s (source %v) -> %s answered: %v", ns, src, addr, sum.Backend)
			} else {
				t.Logf("%s (source %v) -> %s refused: %v", ns, src, addr, sum.Errors)
			}
		}
		c2 := netip.MustParseAddr(client2IP)
		refused(sandbox.Client, c2, lbFW)
		refused(sandbox.Client, c2, lbNode)
		refused("pod-a", netip.Addr{}, lbFW)
		// Upstream drops the node's requests to lb-fw, although they come
		// from the LB IP, which one of its ranges holds.
		refused(sandbox.Node, netip.Addr{}, lbFW)
		// Control: the second client address is fine elsewhere.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: 2, SrcAddr: c2}, 10*time.Second,
			backendsAndSources(2, nil, bridgeIP, nil))
	})

	step("TrafficPolicyLocal", func(e *trafficEnv, t *testing.T) {
		// "local" (10.96.0.40, NodePort 30081, eTP and iTP Local): pod-a
		// on this node, pod-b on node-2 as far as the proxy knows.
		// NodePort: only the local endpoint, and the client's address kept.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: nodeIP + ":30081", Count: n}, 10*time.Second,
			backendsAndSources(n, []string{"pod-a"}, clientIP, nil))
		// ClusterIP from a pod: only the local endpoint (iTP Local).
		e.eventually("pod-b", echo.ClientConfig{Network: "tcp", Addr: "10.96.0.40:80", Count: n}, 10*time.Second,
			backendsAndSources(n, []string{"pod-a"}, podB, nil))
		// "remote" (NodePort 30082, eTP Local, both endpoints on node-2):
		// IPVS mode falls back to the cluster endpoints (#97081), the
		// source still kept.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: nodeIP + ":30082", Count: n}, 10*time.Second,
			backendsAndSources(n, both, clientIP, nil))
		// "itp-remote" (ClusterIP, iTP Local, both on node-2): no
		// cluster endpoints to fall back to, no real server.
		sum, err := e.client(t.Context(), "pod-a", echo.ClientConfig{Network: "tcp", Addr: "10.96.0.42:80", Count: 2, Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if sum.OK != 0 {
			t.Errorf("iTP Local without a local endpoint answered: %v", sum.Backend)
		}
		if d, ok := e.realServers(netip.MustParseAddrPort("10.96.0.42:80")); !ok || len(d) != 0 {
			t.Errorf("10.96.0.42:80: real servers %v (present %v), want a virtual server without any", d, ok)
		}
	})

	step("TerminatingDrains", func(e *trafficEnv, t *testing.T) {
		vs := netip.MustParseAddrPort("10.96.0.31:82")
		held := e.hold(sandbox.Client, vs.String())
		who, err := held.ask("before")
		if err != nil {
			t.Fatal(err)
		}
		other, whoIP, otherIP := "pod-b", podA, podB
		if who == "pod-b" {
			other, whoIP, otherIP = "pod-a", podB, podA
		}
		whoRS := netip.AddrPortFrom(netip.MustParseAddr(whoIP), 8081)
		orig, err := os.ReadFile(filepath.Join(e.state, "drain.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		// who's endpoint terminates: not ready, still serving.
		i := strings.Index(string(orig), `["`+whoIP+`"]`)
		j := strings.Index(string(orig)[i:], "ready: true")
		if i < 0 || j < 0 {
			t.Fatalf("no endpoint %s in drain.yaml", whoIP)
		}
		changed := string(orig)[:i+j] + "ready: false, serving: true, terminating: true" +
			strings.TrimPrefix(string(orig)[i+j:], "ready: true, serving: true, terminating: false")
		t0 := time.Now()
		e.writeState("drain.yaml", changed)
		if err := sandbox.Poll(t.Context(), 10*time.Second, 100*time.Millisecond, func(context.Context) error {
			if d, _ := e.realServers(vs); d[whoRS] != 0 || len(d) != 2 {
				return fmt.Errorf("real servers %v", d)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s not weight 0: %v", whoRS, err)
		}
		t.Logf("%s at weight 0 after %v", whoRS, time.Since(t0).Round(time.Millisecond))
		// The held connection goes on; new ones go to the other pod.
		if got, err := held.ask("during"); err != nil || got != who {
			t.Fatalf("held connection while draining: %q, %v; want %s", got, err, who)
		}
		for i := range n {
			h := e.hold(sandbox.Client, vs.String())
			got, err := h.ask("new-" + strconv.Itoa(i))
			h.in.Close()
			if err != nil || got != other {
				t.Errorf("new connection %d: %q, %v; want %s", i, got, err, other)
			}
		}
		if d, _ := e.realServers(vs); len(d) != 2 {
			t.Fatalf("the draining server went while its connection is open: %v", d)
		}
		// The held connection ends: the server goes once IPVS forgets it.
		held.in.Close()
		t1 := time.Now()
		if err := sandbox.Poll(t.Context(), 40*time.Second, 200*time.Millisecond, func(context.Context) error {
			if d, _ := e.realServers(vs); len(d) != 1 || d[netip.AddrPortFrom(netip.MustParseAddr(otherIP), 8081)] != 1 {
				return fmt.Errorf("real servers %v", d)
			}
			return nil
		}); err != nil {
			t.Fatalf("the idle draining server was not deleted: %v", err)
		}
		t.Logf("%s deleted %v after its last connection ended", whoRS, time.Since(t1).Round(time.Millisecond))
		e.writeState("drain.yaml", string(orig))
		if err := sandbox.Poll(t.Context(), 10*time.Second, 100*time.Millisecond, func(context.Context) error {
			if d, _ := e.realServers(vs); len(d) != 2 || d[whoRS] != 1 {
				return fmt.Errorf("real servers %v", d)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s not back: %v", whoRS, err)
		}
	})

	step("IPv6", func(e *trafficEnv, t *testing.T) {
		const vip6, pod6B, bridge6 = "[fd00:10:96::10]:80", "fd00:10:244::11", "fd00:10:244::1"
		out, err := e.sb.Exec(t.Context(), sandbox.Node, "ipvsadm", "-Sn")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"-A -t [fd00:10:96::10]:80 -s rr", "-a -t [fd00:10:96::10]:80 -r [fd00:10:244::10]:8080 -m -w 1",
			"-A -t [fd00:99::1]:30086 -s rr"} {
			if !strings.Contains(string(out), w) {
				t.Errorf("ipvsadm -Sn lacks %q:\n%s", w, out)
			}
		}
		// Off-cluster: masqueraded to the node's kbr0 address.
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: vip6, Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridge6, nil))
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: "[fd00:99::1]:30086", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridge6, nil))
		// From a pod: its own address, but to itself (hairpin).
		e.eventually("pod-b", echo.ClientConfig{Network: "tcp", Addr: vip6, Count: n}, 10*time.Second,
			backendsAndSources(n, both, "", map[string]string{"pod-a": pod6B, "pod-b": bridge6}))
		e.eventually(sandbox.Node, echo.ClientConfig{Network: "tcp", Addr: vip6, Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridge6, nil))
	})

	step("IPVSDriftRepaired", func(e *trafficEnv, t *testing.T) {
		// Someone deletes a virtual server and a real server with
		// ipvsadm: the next periodic sync puts them back.
		before := e.driftRepairs("ipvs")
		t0 := time.Now()
		for _, c := range [][]string{{"ipvsadm", "-D", "-t", clusterIP + ":80"}, {"ipvsadm", "-d", "-t", "10.96.0.30:81", "-r", podA + ":8081"}} {
			if out, err := e.sb.Exec(t.Context(), sandbox.Node, c...); err != nil {
				t.Fatalf("%v: %v: %s", c, err, out)
			}
		}
		if _, ok := e.realServers(netip.MustParseAddrPort(clusterIP + ":80")); ok {
			t.Fatal("ipvsadm -D left the virtual server")
		}
		if err := sandbox.Poll(t.Context(), 4*syncPeriod, 200*time.Millisecond, func(context.Context) error {
			web, ok := e.realServers(netip.MustParseAddrPort(clusterIP + ":80"))
			held, _ := e.realServers(netip.MustParseAddrPort("10.96.0.30:81"))
			if !ok || len(web) != 2 || len(held) != 2 {
				return fmt.Errorf("%s: %v (present %v); 10.96.0.30:81: %v", clusterIP, web, ok, held)
			}
			return nil
		}); err != nil {
			t.Fatalf("not repaired: %v", err)
		}
		t.Logf("IPVS repaired after %v (sync period %v)", time.Since(t0).Round(time.Millisecond), syncPeriod)
		if after := e.driftRepairs("ipvs"); after <= before {
			t.Errorf("kubenftproxy_drift_repairs_total{table=\"ipvs\"} %d, was %d", after, before)
		}
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, 10*time.Second,
			backendsAndSources(n, both, bridgeIP, nil))
	})

	step("StrayPortWithoutFilterAnswers", func(e *trafficEnv, t *testing.T) {
		// The control for StrayPortOnVIPRefused: without KUBE-IPVS-FILTER
		// the node daemon does answer on the ClusterIP. The proxy is
		// stopped meanwhile: running, it would repair the chain at once.
		if err := root.proxy.Stop(10 * time.Second); err != nil {
			t.Fatalf("stopping the proxy: %v", err)
		}
		if out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "flush", "chain", "ip", "kube-nftproxy-ipvs", "KUBE-IPVS-FILTER"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":" + strayPort, Count: 1}, 5*time.Second,
			backendsAndSources(1, []string{"node"}, clientIP, nil))
		// Started again, the proxy rewrites its helper tables.
		root.startProxy()
		e.eventuallyRefused(clusterIP+":"+strayPort, 20*time.Second)
	})

	step("HelperDriftRepaired", func(e *trafficEnv, t *testing.T) {
		// Running, the proxy repairs its helper tables as soon as the
		// change monitor sees another process change them, well within
		// a sync period.
		for _, tc := range []struct {
			name  string
			cmd   []string
			table string
			works func()
		}{
			{"chain flushed", []string{"nft", "flush", "chain", "ip", "kube-nftproxy-ipvs", "KUBE-IPVS-FILTER"}, "ip kube-nftproxy-ipvs",
				func() { e.eventuallyRefused(clusterIP+":"+strayPort, syncPeriod-time.Second) }},
			{"element removed", []string{"nft", "delete", "element", "ip", "kube-nftproxy-ipvs", "KUBE-CLUSTER-IP", "{ " + clusterIP + " . tcp . 80 }"}, "ip kube-nftproxy-ipvs",
				func() { e.eventuallyElement(clusterIP+" . tcp . 80", syncPeriod-time.Second) }},
			{"table deleted", []string{"nft", "delete", "table", "ip", "kube-nftproxy-ipvs"}, "ip kube-nftproxy-ipvs",
				func() {
					e.eventuallyRefused(clusterIP+":"+strayPort, syncPeriod-time.Second)
					e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: clusterIP + ":80", Count: n}, syncPeriod-time.Second,
						backendsAndSources(n, both, bridgeIP, nil))
				}},
			{"IPv6 rule deleted", []string{"nft", "flush", "chain", "ip6", "kube-nftproxy-ipvs", "KUBE-POSTROUTING"}, "ip6 kube-nftproxy-ipvs",
				func() {
					e.eventually(sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: "[fd00:10:96::10]:80", Count: 2}, syncPeriod-time.Second,
						backendsAndSources(2, nil, "fd00:10:244::1", nil))
				}},
		} {
			before := e.driftRepairs(tc.table)
			t0 := time.Now()
			if out, err := e.sb.Exec(t.Context(), sandbox.Node, tc.cmd...); err != nil {
				t.Fatalf("%s: %v: %s", tc.name, err, out)
			}
			tc.works()
			t.Logf("%s: repaired, working after %v", tc.name, time.Since(t0).Round(time.Millisecond))
			if after := e.driftRepairs(tc.table); after <= before {
				t.Errorf("%s: kubenftproxy_drift_repairs_total{table=%q} %d, was %d", tc.name, tc.table, after, before)
			}
		}
	})
}

// eventuallyRefused waits until a new TCP connection from the client to
// addr is refused (KUBE-IPVS-FILTER).
func (e *trafficEnv) eventuallyRefused(addr string, timeout time.Duration) {
	e.t.Helper()
	err := sandbox.Poll(e.t.Context(), timeout, 100*time.Millisecond, func(ctx context.Context) error {
		sum, err := e.client(ctx, sandbox.Client, echo.ClientConfig{Network: "tcp", Addr: addr, Count: 1, Timeout: 500 * time.Millisecond})
		if err != nil {
			return err
		}
		if sum.OK != 0 {
			return fmt.Errorf("answered by %v", sum.Backend)
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("client -> %s: %v", addr, err)
	}
}

// eventuallyElement waits until the ip helper table lists elem again.
func (e *trafficEnv) eventuallyElement(elem string, timeout time.Duration) {
	e.t.Helper()
	err := sandbox.Poll(e.t.Context(), timeout, 100*time.Millisecond, func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "set", "ip", "kube-nftproxy-ipvs", "KUBE-CLUSTER-IP")
		if err != nil {
			return err
		}
		if !strings.Contains(string(out), elem) {
			return fmt.Errorf("no %s in\n%s", elem, out)
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}
