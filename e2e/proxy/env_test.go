package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The example state's names and addresses (examples/demo, e2e/TOPOLOGY.md).
const (
	exampleState = "../../examples/demo"
	nodeName     = "node-1"

	webSPN         = "default/web:http"
	webClusterIPv4 = "10.96.0.10"
	webClusterIPv6 = "fd00:10:96::10"
	webPort        = "80"
	webNodePort    = "30080"
	dnsSPN         = "default/dns-like:dns"
	dnsClusterIP   = "10.96.0.53"
	dnsPort        = "53"
	dnsNodePort    = "30053"

	podTCPPort = 8080 // the agents' ports: web's and dns-like's target ports
	podUDPPort = 5353
)

// Pods: pod-a and pod-b are the example Services' endpoints; pod-c is a
// client pod that backs nothing.
var (
	podA = sandbox.NewPod("pod-a", 10)
	podB = sandbox.NewPod("pod-b", 11)
	podC = sandbox.NewPod("pod-c", 12)
)

// Addresses the node answers and masquerades with.
var nodeAddrs = []netip.Addr{
	sandbox.BridgeIPv4.Addr(), sandbox.BridgeIPv6.Addr(),
	sandbox.NodeIPv4.Addr(), sandbox.NodeIPv6.Addr(),
}

func hostPort(host, port string) string { return net.JoinHostPort(host, port) }

// env is a sandbox with agent servers in the endpoint pods and the proxy
// running in the node namespace on a state directory of its own.
type env struct {
	sb    *sandbox.Sandbox
	state string // the proxy's --state directory, a copy of examples/demo plus extras
	proxy *proxy
}

type envOptions struct {
	pods []sandbox.Pod // the sandbox's pods; agents serve in pod-a and pod-b
	// extra files to add to the state directory, by name.
	extra map[string]string
	// proxyArgs are more flags for the proxy.
	proxyArgs []string
}

// newEnv builds an env that the end of the test takes down: the proxy is
// stopped (and must exit 0 on SIGTERM), then the sandbox is deleted.
func newEnv(t *testing.T, opts envOptions) *env {
	t.Helper()
	needRoot(t)
	if opts.pods == nil {
		opts.pods = []sandbox.Pod{podA, podB}
	}
	e := &env{sb: newSandbox(t, opts.pods), state: t.TempDir()}
	copyDir(t, exampleState, e.state)
	for name, data := range opts.extra {
		writeAtomic(t, e.state, name, data)
	}
	for _, p := range opts.pods {
		if p.Name == podA.Name || p.Name == podB.Name {
			e.startServer(t, p)
		}
	}
	e.proxy = startProxy(t, e.sb, e.state, opts.proxyArgs...)
	return e
}

// newSandbox creates a sandbox that is deleted when the test ends, with
// default routes in the node namespace via the client, as a real node has
// towards its gateway (without a route, the node's own connections to a
// ClusterIP fail before the nat output hook sees them).
func newSandbox(t *testing.T, pods []sandbox.Pod) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Options{Pods: pods, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	for _, gw := range []netip.Addr{sandbox.ClientIPv4.Addr(), sandbox.ClientIPv6.Addr()} {
		if _, err := sb.Exec(ctx, sandbox.Node, "ip", "route", "add", "default", "via", gw.String(), "dev", sandbox.NodeExtDev); err != nil {
			t.Fatal(err)
		}
	}
	return sb
}

// startServer starts an agent server in pod p on podTCPPort and podUDPPort
// and waits until it answers on both from inside the pod.
func (e *env) startServer(t *testing.T, p sandbox.Pod) {
	t.Helper()
	tcp, udp := fmt.Sprint(podTCPPort), fmt.Sprint(podUDPPort)
	if _, err := e.sb.Start(t.Context(), p.Name, agentBin, "serve", "--name", p.Name, "--tcp", ":"+tcp, "--udp", ":"+udp); err != nil {
		t.Fatal(err)
	}
	for proto, port := range map[string]string{"tcp": tcp, "udp": udp} {
		err := sandbox.Poll(t.Context(), 10*time.Second, 20*time.Millisecond, func(ctx context.Context) error {
			_, err := e.client(ctx, p.Name, proto, hostPort(p.IPv4.String(), port), 1, "--timeout", "200ms")
			return err
		})
		if err != nil {
			t.Fatalf("agent server in %s, %s: %v", p.Name, proto, err)
		}
	}
}

// client runs `e2e-agent client` in namespace ns and returns its summary,
// which is nil only if there was none to read. err is set if the client
// failed, a failed request included.
func (e *env) client(ctx context.Context, ns, proto, addr string, count int, extra ...string) (*echo.Summary, error) {
	args := append([]string{agentBin, "client", "--" + proto, addr, "--count", fmt.Sprint(count)}, extra...)
	out, err := e.sb.Exec(ctx, ns, args...)
	var sum echo.Summary
	if jerr := json.Unmarshal(out, &sum); jerr != nil {
		return nil, errors.Join(err, fmt.Errorf("client output %q: %w", out, jerr))
	}
	return &sum, err
}

// requests sends count requests from ns to addr, listing every result, and
// returns the summary. It stops at the first failed request, so that a
// broken path fails fast. It fails the test only if the client could not
// run; failed requests are for the caller to judge.
func (e *env) requests(t *testing.T, ns, proto, addr string, count int) *echo.Summary {
	t.Helper()
	return e.requestsWithin(t, ns, proto, addr, count, time.Second)
}

// requestsWithin is requests with a timeout of each request's own.
func (e *env) requestsWithin(t *testing.T, ns, proto, addr string, count int, timeout time.Duration) *echo.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second+time.Duration(count)*(timeout-time.Second))
	defer cancel()
	sum, err := e.client(ctx, ns, proto, addr, count, "--results", "all", "--timeout", timeout.String(), "--until-fail")
	if sum == nil {
		t.Fatalf("%s: %s %s: %v", ns, proto, addr, err)
	}
	return sum
}

// expectBackends fails the test unless every request of sum got an answer
// and the answers came from exactly the pods named.
func expectBackends(t *testing.T, what string, sum *echo.Summary, pods ...string) {
	t.Helper()
	if sum.Failed > 0 {
		t.Errorf("%s: request %d failed: %s", what, sum.Failed+sum.OK, firstError(sum))
		return
	}
	got := sortedKeys(sum.Backend)
	want := slices.Sorted(slices.Values(pods))
	if !slices.Equal(got, want) {
		t.Errorf("%s: answered by %v, want each of %v (backends %v)", what, got, want, sum.Backend)
	}
}

// firstError returns the error of the first failed request of sum.
func firstError(sum *echo.Summary) string {
	for _, r := range sum.Results {
		if r.Error != "" {
			return r.Error
		}
	}
	return fmt.Sprint(sum.Errors)
}

// sources returns the distinct source addresses the servers saw.
func sources(sum *echo.Summary) []netip.Addr {
	var out []netip.Addr
	for s := range sum.Sources {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// copyDir copies the regular files of src into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		writeAtomic(t, dst, e.Name(), string(data))
	}
}

// writeAtomic replaces dir/name with data the way a careful editor does: a
// hidden temporary file (which the proxy ignores) renamed over it, so that
// the proxy never reads a half-written file.
func writeAtomic(t *testing.T, dir, name, data string) {
	t.Helper()
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		t.Fatal(err)
	}
}

// proxy is kube-nftproxy running in the node namespace.
type proxy struct {
	proc *sandbox.Process
	log  *lineLog
	// exitJudged says that the test has judged how the process ended
	// (killed on purpose, or expected to fail): the end of the test then
	// only makes sure it is gone.
	exitJudged atomic.Bool
	// expectedErrors are substrings of ERROR lines that the test provokes
	// on purpose (set before the test ends).
	expectedErrors []string
}

// launchProxy starts the proxy command in the node namespace without
// waiting for anything. The end of the test stops it with SIGTERM (killing
// it after stopWait); it must exit 0 and must have logged no error.
func launchProxy(t *testing.T, sb *sandbox.Sandbox, stopWait time.Duration, args ...string) *proxy {
	t.Helper()
	// Not the test's context: its cancellation would signal the proxy
	// before the cleanup below, which wants to see how it exits.
	cmd := sb.Command(context.Background(), sandbox.Node, args...)
	p := &proxy{log: &lineLog{prefix: "proxy: ", logf: t.Logf}}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	proc, err := sb.StartCmd(sandbox.Node, cmd)
	if err != nil {
		t.Fatal(err)
	}
	p.proc = proc
	t.Cleanup(func() {
		if err := p.proc.Stop(stopWait); err != nil && !p.exitJudged.Load() {
			t.Errorf("proxy on SIGTERM: %v (want exit status 0)", err)
		}
		// A failed sync is a bug even when the retry repairs it.
		for _, l := range p.log.lines() {
			if isErrorLine(l) && !slices.ContainsFunc(p.expectedErrors, func(s string) bool { return strings.Contains(l, s) }) {
				t.Errorf("the proxy logged an error: %s", l)
			}
		}
	})
	return p
}

// startProxy runs the proxy on state in the node namespace, with the extra
// flags given, and waits for its first sync. The end of the test stops it
// with SIGTERM, and it must exit 0.
func startProxy(t *testing.T, sb *sandbox.Sandbox, state string, extra ...string) *proxy {
	t.Helper()
	p := launchProxy(t, sb, 5*time.Second, proxyCommand(state, extra...)...)
	p.waitLog(t, 30*time.Second, "the proxy's first sync", func(lines []string) bool {
		return countSyncs(lines) > 0
	})
	return p
}

// proxyCommand is the proxy's command line on state, as startProxy runs it.
func proxyCommand(state string, extra ...string) []string {
	return append([]string{proxyBin, "--proxy-mode=nftables",
		"--state", state,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms",
	}, extra...)
}

func clusterCIDRs() string {
	var s []string
	for _, p := range sandbox.ClusterCIDRs {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// syncs returns how many syncs that changed the kernel's rules the proxy has
// logged so far.
func (p *proxy) syncs() int { return countSyncs(p.log.lines()) }

func countSyncs(lines []string) int {
	n := 0
	for _, l := range lines {
		if isSyncedLine(l) {
			n++
		}
	}
	return n
}

// waitLog polls the proxy's log until cond holds, and fails the test if it
// does not within timeout or if the proxy exits first.
func (p *proxy) waitLog(t *testing.T, timeout time.Duration, what string, cond func(lines []string) bool) {
	t.Helper()
	p.poll(t, timeout, what, func(context.Context) error {
		if cond(p.log.lines()) {
			return nil
		}
		return errors.New("not in the proxy's log yet")
	})
}

// poll calls cond until it returns nil, and fails the test if it does not
// within timeout or if the proxy exits first.
func (p *proxy) poll(t *testing.T, timeout time.Duration, what string, cond func(context.Context) error) {
	t.Helper()
	if err := p.try(t.Context(), timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// try calls cond until it returns nil, for at most timeout, and gives up
// early if the proxy exits; it returns why cond did not hold.
func (p *proxy) try(ctx context.Context, timeout time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-p.proc.Done():
			cancel(fmt.Errorf("the proxy exited: %v", p.proc.Wait()))
		case <-ctx.Done():
		}
	}()
	if err := sandbox.Poll(ctx, timeout, 20*time.Millisecond, cond); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w (%v)", cause, err)
		}
		return err
	}
	return nil
}

// checkRunning fails the test if the proxy has exited.
func (p *proxy) checkRunning(t *testing.T) {
	t.Helper()
	if p.proc.Exited() {
		t.Fatalf("the proxy exited: %v", p.proc.Wait())
	}
}

// lineLog keeps a process's output, line by line, and hands each line to
// logf as well.
type lineLog struct {
	prefix string
	logf   func(format string, args ...any)

	mu      sync.Mutex
	partial []byte
	all     []string
}

func (l *lineLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := slices.Index(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		l.all = append(l.all, line)
		if l.logf != nil {
			l.logf("%s%s", l.prefix, line)
		}
	}
	return len(b), nil
}

// lines returns the complete lines so far.
func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}
