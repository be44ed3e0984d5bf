package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

var agent string // path of the e2e-agent binary, set by TestMain for root

func TestMain(m *testing.M) {
	flag.Parse() // for testing.Short
	code := func() int {
		if os.Geteuid() == 0 && !testing.Short() {
			dir, err := os.MkdirTemp("", "sandbox-test-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			if agent, err = testbin.Agent(dir); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kernel test in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces (run the kernel tests as root: make e2e)")
	}
}

// newSandbox creates a sandbox that is closed when the test ends.
func newSandbox(t *testing.T, opts sandbox.Options) *sandbox.Sandbox {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb, err := sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	return sb
}

// startServers starts an agent server in each pod and waits until each
// answers on TCP and UDP from inside its own namespace.
func startServers(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	for _, p := range sb.Pods() {
		if _, err := sb.Start(t.Context(), p.Name, agent, "serve", "--name", p.Name, "--tcp", ":8080", "--udp", ":5353"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range sb.Pods() {
		for _, flag := range []string{"--tcp", "--udp"} {
			port := map[string]string{"--tcp": "8080", "--udp": "5353"}[flag]
			err := sandbox.Poll(t.Context(), 10*time.Second, 20*time.Millisecond, func(ctx context.Context) error {
				_, err := sb.Exec(ctx, p.Name, agent, "client", flag, "127.0.0.1:"+port, "--count", "1", "--timeout", "200ms")
				return err
			})
			if err != nil {
				t.Fatalf("agent server in %s %s: %v", p.Name, flag, err)
			}
		}
	}
}

// client runs the agent client in ns and returns its summary.
func client(t *testing.T, sb *sandbox.Sandbox, ns string, args ...string) *echo.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := sb.Exec(ctx, ns, append([]string{agent, "client"}, args...)...)
	var sum echo.Summary
	if jerr := json.Unmarshal(out, &sum); jerr != nil {
		t.Fatalf("%s: client %v: %v (output %q, parse: %v)", ns, args, err, out, jerr)
	}
	if err != nil {
		t.Errorf("%s: client %v: %v: %+v", ns, args, err, sum)
	}
	return &sum
}

func hostPort(a netip.Addr, port string) string { return net.JoinHostPort(a.String(), port) }

func TestSandboxTraffic(t *testing.T) {
	needRoot(t)
	sb := newSandbox(t, sandbox.Options{})

	listed := namespaces(t)
	for _, ns := range sb.Namespaces() {
		if real := sb.NS(ns); !strings.HasPrefix(real, sb.Prefix()) || !slices.Contains(listed, real) {
			t.Errorf("NS(%q) = %q, not in ip netns list %v", ns, real, listed)
		}
	}
	if got := sb.NS("nope"); got != "" {
		t.Errorf(`NS("nope") = %q, want ""`, got)
	}
	if _, err := sb.Exec(t.Context(), "nope", "true"); err == nil {
		t.Error("Exec in an unknown namespace succeeded")
	}

	// Hairpin mode on the pod ports; br_netfilter on where it exists.
	out, err := sb.Exec(t.Context(), sandbox.Node, "ip", "-d", "-j", "link", "show", "master", sandbox.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	var ports []struct {
		Name     string `json:"ifname"`
		LinkInfo struct {
			SlaveData struct {
				Hairpin bool `json:"hairpin"`
			} `json:"info_slave_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal(out, &ports); err != nil {
		t.Fatal(err)
	}
	if len(ports) != len(sb.Pods()) {
		t.Errorf("%d bridge ports, want %d", len(ports), len(sb.Pods()))
	}
	for _, p := range ports {
		if !p.LinkInfo.SlaveData.Hairpin {
			t.Errorf("bridge port %s: hairpin off", p.Name)
		}
	}
	if out, err := sb.Exec(t.Context(), sandbox.Node, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables"); err == nil && strings.TrimSpace(string(out)) != "1" {
		t.Errorf("bridge-nf-call-iptables = %q, want 1", out)
	}

	startServers(t, sb)
	podA, _ := sb.Pod("pod-a")
	podB, _ := sb.Pod("pod-b")

	tests := []struct {
		name    string
		from    string
		proto   string
		to      netip.Addr
		port    string
		backend string
		source  netip.Addr // as the server sees it
	}{
		{"node to pod-a tcp4", sandbox.Node, "--tcp", podA.IPv4, "8080", "pod-a", sandbox.BridgeIPv4.Addr()},
		{"node to pod-a udp4", sandbox.Node, "--udp", podA.IPv4, "5353", "pod-a", sandbox.BridgeIPv4.Addr()},
		{"node to pod-a tcp6", sandbox.Node, "--tcp", podA.IPv6, "8080", "pod-a", sandbox.BridgeIPv6.Addr()},
		{"node to pod-a udp6", sandbox.Node, "--udp", podA.IPv6, "5353", "pod-a", sandbox.BridgeIPv6.Addr()},
		{"node to pod-b tcp4", sandbox.Node, "--tcp", podB.IPv4, "8080", "pod-b", sandbox.BridgeIPv4.Addr()},
		{"client to pod-a tcp4", sandbox.Client, "--tcp", podA.IPv4, "8080", "pod-a", sandbox.ClientIPv4.Addr()},
		{"client to pod-b udp4", sandbox.Client, "--udp", podB.IPv4, "5353", "pod-b", sandbox.ClientIPv4.Addr()},
		{"client to pod-a tcp6", sandbox.Client, "--tcp", podA.IPv6, "8080", "pod-a", sandbox.ClientIPv6.Addr()},
		{"client to pod-b udp6", sandbox.Client, "--udp", podB.IPv6, "5353", "pod-b", sandbox.ClientIPv6.Addr()},
		{"pod-a to pod-b tcp4", "pod-a", "--tcp", podB.IPv4, "8080", "pod-b", podA.IPv4},
		{"pod-b to pod-a udp6", "pod-b", "--udp", podA.IPv6, "5353", "pod-a", podB.IPv6},
		{"pod-a to node tcp4 (nothing listens)", "pod-a", "--tcp", sandbox.BridgeIPv4.Addr(), "8080", "", netip.Addr{}},
		{"pod-a to client tcp4 (nothing listens)", "pod-a", "--tcp", sandbox.ClientIPv4.Addr(), "8080", "", netip.Addr{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{tt.proto, hostPort(tt.to, tt.port), "--count", "3", "--timeout", "2s"}
			if tt.backend == "" {
				// No server: a refusal proves the path (a
				// timeout would mean it is broken).
				out, err := sb.Exec(t.Context(), tt.from, append([]string{agent, "client"}, args...)...)
				var sum echo.Summary
				if jerr := json.Unmarshal(out, &sum); jerr != nil || err == nil || sum.Errors["refused"] != 3 {
					t.Errorf("want 3 refusals, got %s (%v)", out, err)
				}
				return
			}
			sum := client(t, sb, tt.from, args...)
			if sum.OK != 3 || sum.Backend[tt.backend] != 3 || sum.Sources[tt.source.String()] != 3 {
				t.Errorf("want 3 replies from %s seeing source %s, got %+v", tt.backend, tt.source, sum)
			}
		})
	}

	// A fixed source port: the server sees it.
	sum := client(t, sb, sandbox.Client, "--tcp", hostPort(podA.IPv4, "8080"), "--count", "3", "--src-port", "40123", "--results", "all")
	for _, r := range sum.Results {
		if want := hostPort(sandbox.ClientIPv4.Addr(), "40123"); r.Source != want {
			t.Errorf("source %q, want %q", r.Source, want)
		}
	}

	// HTTP for curl.
	out, err = sb.Exec(t.Context(), sandbox.Node, "curl", "-sS", "--max-time", "5", "http://"+hostPort(podB.IPv4, "8080")+"/")
	if err != nil || !strings.HasPrefix(string(out), "pod-b "+sandbox.BridgeIPv4.Addr().String()+":") {
		t.Errorf("curl: %q, %v", out, err)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Options{
		Logf:        t.Logf,
		Pods:        append(sandbox.DefaultPods(), sandbox.NewPod("pod-with-a-long-name", 12)),
		StopTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if got := len(sb.Namespaces()); got != 5 {
		t.Errorf("%d namespaces, want 5", got)
	}
	// One process that exits on SIGTERM, one that ignores it.
	polite, err := sb.Start(ctx, "pod-a", agent, "serve", "--name", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "trapped")
	stubborn, err := sb.Start(ctx, "pod-with-a-long-name", "sh", "-c", `trap "" TERM; : >"$0"; while :; do sleep 0.05; done`, mark)
	if err != nil {
		t.Fatal(err)
	}
	err = sandbox.Poll(ctx, 10*time.Second, 10*time.Millisecond, func(ctx context.Context) error {
		if _, err := os.Stat(mark); err != nil {
			return err
		}
		_, err := sb.Exec(ctx, "pod-a", agent, "client", "--tcp", "127.0.0.1:8080", "--timeout", "200ms")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if !polite.Exited() || !stubborn.Exited() {
		t.Errorf("processes still running after Close: %v %v", polite.Exited(), stubborn.Exited())
	}
	if err := polite.Wait(); err != nil {
		t.Errorf("agent serve on SIGTERM: %v, want a clean exit", err)
	}
	var ee *exec.ExitError
	if err := stubborn.Wait(); !errors.As(err, &ee) {
		t.Errorf("stubborn process: %v, want killed", err)
	}
	for _, ns := range namespaces(t) {
		if strings.HasPrefix(ns, sb.Prefix()) {
			t.Errorf("namespace %s left after Close", ns)
		}
	}
	if err := sb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := sb.Start(ctx, "pod-a", "true"); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestFailedNewLeavesNothing(t *testing.T) {
	needRoot(t)
	var prefix string
	sandbox.SetNewHook(func(p string) { prefix = p })
	defer sandbox.SetNewHook(nil)
	// Timeouts too short to finish: New fails at different steps.
	for _, timeout := range []time.Duration{2, 10, 20, 40, 80} {
		ctx, cancel := context.WithTimeout(t.Context(), timeout*time.Millisecond)
		sb, err := sandbox.New(ctx, sandbox.Options{Logf: t.Logf})
		cancel()
		if err == nil {
			sb.Close()
			continue
		}
		t.Logf("New with %dms: %v", timeout, err)
		if prefix == "" {
			continue // failed before choosing a name
		}
		for _, ns := range namespaces(t) {
			if strings.HasPrefix(ns, prefix) {
				t.Errorf("namespace %s left behind by a failed New", ns)
			}
		}
		prefix = ""
	}
}

func TestSweepStale(t *testing.T) {
	needRoot(t)
	// A namespace that looks like a sandbox's but has no lock file: its
	// owner is gone.
	stale := "knp-fffff0-node"
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", stale).Run() })
	// A live sandbox, which the sweep must leave alone.
	live := newSandbox(t, sandbox.Options{Pods: []sandbox.Pod{}})
	newSandbox(t, sandbox.Options{Pods: []sandbox.Pod{}})
	listed := namespaces(t)
	if slices.Contains(listed, stale) {
		t.Errorf("stale namespace %s not swept", stale)
	}
	if !slices.Contains(listed, live.NS(sandbox.Node)) {
		t.Errorf("live sandbox %s swept", live.Prefix())
	}
}

func TestOptionsValidation(t *testing.T) {
	// Checked before anything needs root.
	for _, pods := range [][]sandbox.Pod{
		{sandbox.NewPod("node", 10)},
		{sandbox.NewPod("Pod_A", 10)},
		{sandbox.NewPod("pod-a", 10), sandbox.NewPod("pod-b", 10)},
		{sandbox.NewPod("pod-a", 1)},
		{{Name: "pod-a", IPv4: netip.MustParseAddr("10.1.0.1")}},
	} {
		sb, err := sandbox.New(t.Context(), sandbox.Options{Pods: pods})
		if err == nil {
			sb.Close()
			t.Errorf("New with pods %v succeeded", pods)
		} else if strings.Contains(err.Error(), "root") {
			t.Errorf("New with pods %v: %v, want a validation error", pods, err)
		}
	}
}

// namespaces lists `ip netns list`.
func namespaces(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

func TestNewPod(t *testing.T) {
	p := sandbox.NewPod("pod-c", 12)
	if p.IPv4 != netip.MustParseAddr("10.244.0.12") || p.IPv6 != netip.MustParseAddr("fd00:10:244::12") {
		t.Errorf("NewPod(pod-c, 12) = %+v", p)
	}
	for i, want := range sandbox.DefaultPods() {
		if got := sandbox.NewPod(want.Name, 10+i); got != want {
			t.Errorf("NewPod = %+v, want %+v", got, want)
		}
	}
}
