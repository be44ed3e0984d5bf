package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The example state's Services (examples/demo, see e2e/TOPOLOGY.md).
const (
	webClusterIPv4 = "10.96.0.10"
	webClusterIPv6 = "fd00:10:96::10"
	webPort        = "80"
	webNodePort    = "30080"
	dnsClusterIP   = "10.96.0.53"
	dnsPort        = "53"
	podTCPPort     = "8080"
	podUDPPort     = "5353"
	nodeName       = "node-1"
	requests       = 10
)

// check is one block of requests the demo shows.
type check struct {
	title string
	from  string // sandbox namespace
	proto string // "tcp" or "udp"
	addr  string
}

func checks() []check {
	nodePort := net.JoinHostPort(sandbox.NodeIPv4.Addr().String(), webNodePort)
	return []check{
		{"TCP from pod-a to ClusterIP", "pod-a", "tcp", net.JoinHostPort(webClusterIPv4, webPort)},
		{"TCP from the client to NodePort", sandbox.Client, "tcp", nodePort},
		{"UDP from pod-b to ClusterIP", "pod-b", "udp", net.JoinHostPort(dnsClusterIP, dnsPort)},
		{"TCP from pod-b to IPv6 ClusterIP", "pod-b", "tcp", net.JoinHostPort(webClusterIPv6, webPort)},
	}
}

func run(ctx context.Context, cfg config) (err error) {
	out := cfg.Out
	proxy, err := executable(cfg.Proxy, "go build -o bin/ ./cmd/kube-nftproxy")
	if err != nil {
		return err
	}
	agent, err := executable(cfg.Agent, "go build -o bin/e2e-agent ./e2e/agent")
	if err != nil {
		return err
	}
	state, err := filepath.Abs(cfg.State)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(state); err != nil || !fi.IsDir() {
		return fmt.Errorf("state directory %s: not a directory (%v)", cfg.State, err)
	}
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces: run it as root")
	}

	opts := sandbox.Options{}
	if cfg.Verbose {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(cfg.Err, "  | "+format+"\n", args...) }
	}
	sb, err := sandbox.New(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := sb.Close(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		fmt.Fprintf(out, "\nSandbox %s deleted.\n", sb.Prefix())
	}()

	heading(out, "Sandbox %s: a node, two pods and a client, each a network namespace", sb.Prefix())
	if cfg.Verbose {
		describeSandbox(out, sb)
	}

	// Backends.
	for _, p := range sb.Pods() {
		if _, err := sb.Start(ctx, p.Name, agent, "serve", "--name", p.Name, "--tcp", ":"+podTCPPort, "--udp", ":"+podUDPPort); err != nil {
			return err
		}
	}
	for _, p := range sb.Pods() {
		err := sandbox.Poll(ctx, 10*time.Second, 20*time.Millisecond, func(ctx context.Context) error {
			_, err := request(ctx, sb, agent, p.Name, "tcp", net.JoinHostPort(p.IPv4.String(), podTCPPort), 1, "--until-ok")
			return err
		})
		if err != nil {
			return fmt.Errorf("agent in %s: %w", p.Name, err)
		}
	}
	if cfg.Verbose {
		fmt.Fprintf(out, "  agents  answering on TCP %s and UDP %s in every pod\n", podTCPPort, podUDPPort)
	}

	// The proxy.
	logFile, err := openLog(cfg.ProxyLog)
	if err != nil {
		return err
	}
	defer func() {
		logFile.Close()
		if cfg.ProxyLog == "" && err == nil {
			os.Remove(logFile.Name()) // kept, and its end shown, when the demo fails
		}
	}()
	args := []string{proxy,
		"--proxy-mode=nftables",
		"--state", state,
		"--hostname-override", nodeName,
		"--cluster-cidr", sandbox.ClusterCIDRs[0].String() + "," + sandbox.ClusterCIDRs[1].String(),
	}
	if cfg.Verbose {
		heading(out, "Proxy")
		fmt.Fprintf(out, "  %s\n  log: %s\n", strings.Join(args, " "), logFile.Name())
	}
	cmd := sb.Command(ctx, sandbox.Node, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	proc, err := sb.StartCmd(sandbox.Node, cmd)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			showLogTail(out, logFile.Name(), 20)
		}
	}()
	defer func() {
		if proc.Exited() {
			return
		}
		perr := proc.Stop(5 * time.Second)
		if perr != nil {
			err = errors.Join(err, fmt.Errorf("proxy on SIGTERM: %w", perr))
			return
		}
		fmt.Fprintf(out, "\nProxy stopped (SIGTERM, exit 0).\n")
	}()

	// Wait for the first Service to answer; stop early if the proxy dies.
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-proc.Done():
			cancel(fmt.Errorf("proxy exited: %v", proc.Wait()))
		case <-waitCtx.Done():
		}
	}()
	start := time.Now()
	first := checks()[0]
	err = sandbox.Poll(waitCtx, cfg.Wait, 100*time.Millisecond, func(ctx context.Context) error {
		_, err := request(ctx, sb, agent, first.from, first.proto, first.addr, 1, "--timeout", "300ms")
		return err
	})
	if err != nil {
		if cause := context.Cause(waitCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return fmt.Errorf("waiting for %s %s to answer: %w", first.proto, first.addr, err)
	}
	fmt.Fprintf(out, "  kube-nftproxy started in the node; Service %s answered %v later\n", first.addr, time.Since(start).Round(time.Millisecond))

	results := make([]checkResult, 0, len(checks()))
	for _, c := range checks() {
		results = append(results, runCheck(ctx, sb, agent, c))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	failed := showResults(out, sb, results, cfg.Verbose)
	if cfg.Ruleset {
		heading(out, "nft list ruleset (node)")
		ruleset, err := sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		out.Write(ruleset)
	} else {
		fmt.Fprintf(out, "\n  The node's rules: make demo DEMO_FLAGS=--ruleset (nft list ruleset).\n")
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks had failed requests", failed, len(checks()))
	}
	return nil
}

// describeSandbox lists the sandbox's namespaces and addresses.
func describeSandbox(out io.Writer, sb *sandbox.Sandbox) {
	fmt.Fprintf(out, "  node    %-22s kbr0 %s, %s; ext0 %s, %s\n", sb.NS(sandbox.Node),
		sandbox.BridgeIPv4.Addr(), sandbox.BridgeIPv6.Addr(), sandbox.NodeIPv4.Addr(), sandbox.NodeIPv6.Addr())
	for _, p := range sb.Pods() {
		fmt.Fprintf(out, "  %-7s %-22s eth0 %s, %s\n", p.Name, sb.NS(p.Name), p.IPv4, p.IPv6)
	}
	fmt.Fprintf(out, "  client  %-22s eth0 %s, %s\n", sb.NS(sandbox.Client), sandbox.ClientIPv4.Addr(), sandbox.ClientIPv6.Addr())
}

// checkResult is what one check's requests got.
type checkResult struct {
	check
	sum *echo.Summary
	err error
}

func runCheck(ctx context.Context, sb *sandbox.Sandbox, agent string, c check) checkResult {
	sum, err := request(ctx, sb, agent, c.from, c.proto, c.addr, requests, "--results", "all", "--interval", "20ms")
	return checkResult{check: c, sum: sum, err: err}
}

// showResults prints a line per check (who answered, and which source
// address the backends saw, and why), then, when verbose, every request;
// it returns how many checks had a failed request.
func showResults(out io.Writer, sb *sandbox.Sandbox, results []checkResult, verbose bool) (failed int) {
	heading(out, "Requests (%d per flow)", requests)
	for _, r := range results {
		fmt.Fprintf(out, "  %s %s\n", r.title, r.addr)
		if r.sum == nil {
			fmt.Fprintf(out, "    error: %v\n", r.err)
			failed++
			continue
		}
		fmt.Fprintf(out, "    answered by  %s; %d failed\n", counts(r.sum.Backend), r.sum.Failed)
		fmt.Fprintf(out, "    source seen  %s\n", describeSources(sb, r.from, r.sum.Results))
		if r.err != nil || r.sum.Failed > 0 {
			failed++
		}
	}
	if verbose {
		for _, r := range results {
			showRequests(out, r)
		}
	}
	return failed
}

// showRequests prints a line per request of one check.
func showRequests(out io.Writer, r checkResult) {
	if r.sum == nil {
		return
	}
	heading(out, "%s %s (%s)", r.title, r.addr, r.proto)
	for i, res := range r.sum.Results {
		if res.Error != "" {
			fmt.Fprintf(out, "  %2d  FAILED  %s\n", i+1, res.Error)
			continue
		}
		fmt.Fprintf(out, "  %2d  %-6s  seen from %-28s %6.2f ms\n", i+1, res.Backend, res.Source, res.RTTMS)
	}
}

// describeSources says which source address the backends saw: the
// requester's own (kept), or the node's (masqueraded), and why: a pod
// answered by itself through the Service (hairpin), or a client outside
// the cluster reaching a NodePort (externalTrafficPolicy: Cluster).
func describeSources(sb *sandbox.Sandbox, from string, results []echo.Result) string {
	var own []string
	if p, ok := sb.Pod(from); ok {
		own = []string{p.IPv4.String(), p.IPv6.String()}
	} else if from == sandbox.Client {
		own = []string{sandbox.ClientIPv4.Addr().String(), sandbox.ClientIPv6.Addr().String()}
	}
	seen := map[string]int{}
	for _, r := range results {
		if r.Error != "" {
			continue
		}
		src := r.Source
		if ap, err := netip.ParseAddrPort(r.Source); err == nil {
			src = ap.Addr().String()
		}
		switch {
		case slices.Contains(own, src):
			seen["its own address "+src+" (kept)"]++
		case r.Backend == from:
			seen[src+" (masqueraded: "+from+" answered itself through the Service, a hairpin)"]++
		case from == sandbox.Client:
			seen[src+" (masqueraded: from outside the cluster to a NodePort, externalTrafficPolicy Cluster)"]++
		default:
			seen[src+" (masqueraded)"]++
		}
	}
	if len(seen) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range sortedKeys(seen) {
		parts = append(parts, fmt.Sprintf("%s x%d", k, seen[k]))
	}
	return strings.Join(parts, "; ")
}

// request runs the agent client in ns and returns its summary. The error is
// set if the client failed (a failed request included); the summary is nil
// only if there was none to read.
func request(ctx context.Context, sb *sandbox.Sandbox, agent, ns, proto, addr string, count int, extra ...string) (*echo.Summary, error) {
	args := append([]string{agent, "client", "--" + proto, addr, "--count", fmt.Sprint(count)}, extra...)
	out, err := sb.Exec(ctx, ns, args...)
	var sum echo.Summary
	if jerr := json.Unmarshal(out, &sum); jerr != nil {
		if err == nil {
			err = fmt.Errorf("client output %q: %w", out, jerr)
		}
		return nil, err
	}
	return &sum, err
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "no answers"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func heading(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "\n== "+format+"\n", args...)
}

// executable resolves path to an absolute one and checks that it is an
// executable file; hint says how to build it.
func executable(path, hint string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%w (build it: %s)", err, hint)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	return abs, nil
}

func openLog(path string) (*os.File, error) {
	if path == "" {
		f, err := os.CreateTemp("", "kube-nftproxy-demo-*.log")
		if err != nil {
			return nil, fmt.Errorf("proxy log: %w", err)
		}
		return f, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("proxy log: %w", err)
	}
	return f, nil
}

// showLogTail prints the last n lines of the proxy's log.
func showLogTail(out io.Writer, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return
	}
	heading(out, "Last lines of the proxy's log (%s)", path)
	for _, l := range lines {
		fmt.Fprintf(out, "  %s\n", l)
	}
}
