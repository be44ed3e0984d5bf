// Package upstream runs upstream kube-proxy (iptables mode) and
// kube-nftproxy side by side against one real API server, each in a network
// namespace of its own, and checks with `kube-nftproxy diff` that they
// program the same thing for every Service port; and, both in nftables
// mode, that they give traffic to ClusterIPs the same verdicts. The tests
// run in parallel: each has its own API server and namespaces, and most of
// their time is waiting for the proxies' syncs.
package upstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

// legacyTools are the iptables-legacy binaries kube-proxy runs under their
// plain names (iptables, iptables-save, ...): this kernel has ip_tables.
var legacyTools = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

func needTools(t *testing.T) (kubeProxy string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kernel test in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, iptables and nftables")
	}
	if err := apiserver.Available(); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skipf("skipping: %v", err)
	}
	kubeProxy = apiserver.KubeProxyPath()
	if _, err := os.Stat(kubeProxy); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("upstream kube-proxy: %v (build it with hack/kube-proxy/build.sh)", err)
		}
		t.Skipf("skipping: upstream kube-proxy: %v (build it with hack/kube-proxy/build.sh)", err)
	}
	for _, tool := range legacyTools {
		if _, err := exec.LookPath(strings.Replace(tool, "tables", "tables-legacy", 1)); err != nil {
			if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
				t.Fatalf("%v (apt-get install iptables)", err)
			}
			t.Skipf("skipping: %v (apt-get install iptables)", err)
		}
	}
	return kubeProxy
}

// netns creates a named network namespace with loopback up, deleted at the end.
func netns(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// link joins the API server's namespace to another with a veth pair:
// apiAddr on the API side, peerAddr (both /30) on the other.
func link(t *testing.T, apiNS, peerNS, apiAddr, peerAddr string) {
	t.Helper()
	a, p := "to-"+peerNS[len(peerNS)-6:], "api0"
	run(t, "ip", "-n", apiNS, "link", "add", a, "type", "veth", "peer", "name", p, "netns", peerNS)
	run(t, "ip", "-n", apiNS, "addr", "add", apiAddr+"/30", "dev", a)
	run(t, "ip", "-n", peerNS, "addr", "add", peerAddr+"/30", "dev", p)
	run(t, "ip", "-n", apiNS, "link", "set", a, "up")
	run(t, "ip", "-n", peerNS, "link", "set", p, "up")
}

// kubeconfigVia is the proxy kubeconfig pointed at the API server through
// apiAddr, still checking the certificate issued for 127.0.0.1.
func kubeconfigVia(t *testing.T, srv *apiserver.Server, apiAddr, dir string) string {
	t.Helper()
	b, err := os.ReadFile(srv.ProxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(srv.Host)
	s := strings.Replace(string(b), "server: "+srv.URL, "server: https://"+net.JoinHostPort(apiAddr, port)+"\n    tls-server-name: 127.0.0.1", 1)
	path := filepath.Join(dir, "kubeconfig-"+apiAddr)
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is a proxy running in a namespace; the end of the test stops it.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

func start(t *testing.T, name, ns, logPath string, env []string, argv ...string) *process {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("%s log tail:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// stop sends SIGTERM to the process group and waits (SIGKILL after 10 s).
func (p *process) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd.ProcessState = &os.ProcessState{} // stopped; do not wait again
}

func (p *process) exited() error {
	select {
	case err := <-p.done:
		p.done <- err
		return fmt.Errorf("%s exited: %v", p.name, err)
	default:
		return nil
	}
}

// freePort is a port free on 127.0.0.1 of ns a moment ago.
func freePort(t *testing.T, ns string, taken map[int]bool) int {
	t.Helper()
	for {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		p := 20000 + int(b[0])<<8%20000 + int(b[1])
		if taken[p] {
			continue
		}
		out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Htln", "sport", "= :"+strconv.Itoa(p)).Output()
		if strings.TrimSpace(string(out)) == "" {
			taken[p] = true
			return p
		}
	}
}

// side is one proxy's namespace and how to read its rules.
type testEnv struct {
	t          *testing.T
	dir        string
	srv        *apiserver.Server
	ours       string // kube-nftproxy binary
	upNS, ouNS string
}

// dumps saves upstream's iptables-save and ip6tables-save output.
func (e *testEnv) dumps(suffix string) []string {
	var paths []string
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := exec.Command("ip", "netns", "exec", e.upNS, tool).Output()
		if err != nil {
			e.t.Fatalf("%s in %s: %v", tool, e.upNS, err)
		}
		p := filepath.Join(e.dir, tool+suffix+".txt")
		if err := os.WriteFile(p, out, 0o644); err != nil {
			e.t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// diff runs `kube-nftproxy diff` in our namespace against the dumps and
// returns its output and exit code.
func (e *testEnv) diff(dumps ...string) (string, int) {
	args := []string{"netns", "exec", e.ouNS, e.ours, "diff"}
	for _, d := range dumps {
		args = append(args, "--iptables-save", d)
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	e.t.Fatalf("diff: %v", err)
	return "", -1
}

func (e *testEnv) do(method, path string, in, out any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	if err := e.srv.Do(ctx, method, path, in, out); err != nil {
		e.t.Fatal(err)
	}
}

// saveObjects writes the Services, EndpointSlices and Nodes as a `kind:
// List` file that --state reads.
func (e *testEnv) saveObjects(dir string) {
	var items []any
	for _, l := range []struct{ path, apiVersion, kind string }{
		{"/api/v1/namespaces/default/services", "v1", "Service"},
		{"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", "discovery.k8s.io/v1", "EndpointSlice"},
		{"/api/v1/nodes", "v1", "Node"},
	} {
		var list struct {
			Items []map[string]any `json:"items"`
		}
		e.do("GET", l.path, nil, &list)
		for _, it := range list.Items {
			it["apiVersion"], it["kind"] = l.apiVersion, l.kind
			delete(it["metadata"].(map[string]any), "managedFields")
			items = append(items, it)
		}
	}
	b, _ := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, "", "  ")
	_ = os.WriteFile(filepath.Join(dir, "objects.json"), b, 0o644)
}

// servicePortLine matches a Service port's line of diff's report.
var servicePortLine = regexp.MustCompile(`^\S+ (tcp|udp|sctp)( \(IPv6\))?: `)

// newTestEnv starts a real API server in a namespace of its own, linked
// to one namespace for upstream's kube-proxy and one for ours; the API
// server and the namespaces last as long as the test.
func newTestEnv(t *testing.T, dir, ours string) *testEnv {
	apiNS, upNS, ouNS := netns(t, "knp-api-"), netns(t, "knp-up-"), netns(t, "knp-ou-")
	link(t, apiNS, upNS, "10.123.1.1", "10.123.1.2")
	link(t, apiNS, ouNS, "10.123.2.1", "10.123.2.2")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: apiNS, ExtraArgs: []string{"--bind-address=0.0.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, dir: dir, srv: srv, ours: ours, upNS: upNS, ouNS: ouNS}
}

// TestUpstreamIPTablesDiff: upstream kube-proxy v1.37.1 in iptables mode and
// kube-nftproxy program the same Services (every feature: ClusterIP,
// NodePort, LoadBalancer with source ranges, external IPs, affinity, both
// traffic policies Local, Services without endpoints, several ports,
// dual-stack) in namespaces of their own; `diff` of upstream's
// iptables-save against our live tables says equal for every Service port,
// and names the one Service port whose endpoint then changes on our side
// only (and, in the dump text, on upstream's side only).
func TestUpstreamIPTablesDiff(t *testing.T) {
	t.Parallel()
	kubeProxy := needTools(t)
	dir := t.TempDir()
	ours, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := legacyBin(t, dir)

	e := newTestEnv(t, dir, ours)

	// The objects, before either proxy starts.
	createObjects(e)
	specs := featureServices()
	wantPorts := 1 // default/kubernetes:https
	for _, s := range specs {
		wantPorts += len(s.svc.Ports) * len(s.svc.IPFamilies)
	}

	cidrs := "10.244.0.0/16,fd00:10:244::/48"
	taken := map[int]bool{}
	up := start(t, "kube-proxy", e.upNS, filepath.Join(dir, "kube-proxy.log"), []string{"PATH=" + bin + ":" + os.Getenv("PATH")},
		kubeProxy, "--proxy-mode=iptables", "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.1.1", dir),
		"--hostname-override", localNode, "--cluster-cidr", cidrs,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.upNS, taken)),
		"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.upNS, taken)),
		// --iptables-localhost-nodeports: true, iptables mode's default,
		// as ours in --proxy-mode=iptables.
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--iptables-min-sync-period=100ms", "--v=2")
	ou := start(t, "kube-nftproxy", e.ouNS, filepath.Join(dir, "kube-nftproxy.log"), nil,
		ours, "--proxy-mode=iptables", "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.2.1", dir),
		"--hostname-override", localNode, "--cluster-cidr", cidrs,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.ouNS, taken)),
		"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.ouNS, taken)),
		"--iptables-min-sync-period=100ms")

	// Both converge: every Service port equal, within a deadline.
	out := converge(t, []*process{up, ou}, wantPorts, func() (string, int) {
		return e.diff(e.dumps("")...)
	})
	var code int // of the diffs below
	t.Logf("diff of upstream's iptables-save against our live tables:\n%s", out)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if servicePortLine.MatchString(l) && !strings.Contains(l, ": equal") {
			t.Errorf("not equal: %s", l)
		}
	}
	for _, want := range []string{
		"default/lb-empty:https tcp: equal (known difference: " + "loadBalancerSourceRanges without endpoints",
		"default/ext-empty:http tcp: equal (known difference: the node's own connections to external/LB IPs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	checkDumpsCurrent(t, e.dumps(""))
	if os.Getenv("KNP_SAVE_DUMPS") != "" { // refresh migrate/testdata from a real run
		for _, f := range []string{"iptables-legacy-save.txt", "ip6tables-legacy-save.txt"} {
			b, _ := os.ReadFile(filepath.Join(dir, f))
			_ = os.WriteFile(filepath.Join(os.Getenv("KNP_SAVE_DUMPS"), f), b, 0o644)
		}
		e.saveObjects(os.Getenv("KNP_SAVE_DUMPS"))
	}

	// One side only, in the dump text: np's remote endpoint moves.
	edited := e.dumps("-edited")
	b, _ := os.ReadFile(edited[0])
	npDNAT := regexp.MustCompile(`(?m)^(-A KUBE-SEP-\S+ .*"default/np:http".*--to-destination )10\.244\.1\.21:8080$`)
	if !npDNAT.Match(b) {
		t.Fatalf("upstream's dump lacks np's DNAT to 10.244.1.21:8080")
	}
	if err := os.WriteFile(edited[0], npDNAT.ReplaceAll(b, []byte("${1}10.244.1.99:8080")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = e.diff(edited...)
	t.Logf("after editing np's endpoint in the dump:\n%s", out)
	checkOnlyDifferent(t, out, code, "default/np:http tcp: different: ", "endpoints: KUBE-SVC-QUMPV5Z3SF2IMFUJ: iptables [10.244.0.10:8080 33.33%, 10.244.1.20:8080 33.33%, 10.244.1.99:8080 33.33%]")

	// One side only, for real: upstream stops (its rules stay), then np
	// loses an endpoint; ours follows, upstream's rules do not.
	up.stop()
	var slice map[string]any
	e.do("GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/np-ipv4", nil, &slice)
	eps := slice["endpoints"].([]any)
	slice["endpoints"] = eps[:len(eps)-1]
	e.do("PUT", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/np-ipv4", slice, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code = e.diff(e.dumps("-stopped")...)
		if code != 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("after np lost an endpoint with upstream stopped:\n%s", out)
	checkOnlyDifferent(t, out, code, "default/np:http tcp: different: ", "ours [10.244.0.10:8080 50%, 10.244.1.20:8080 50%]")
}

// checkOnlyDifferent checks that diff exited 1 and that the one line not
// equal starts with want and contains what.
func checkOnlyDifferent(t *testing.T, out string, code int, want, what string) {
	t.Helper()
	if code != 1 {
		t.Errorf("diff exited %d, want 1", code)
	}
	found := false
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasPrefix(l, want):
			found = true
			if !strings.Contains(l, what) {
				t.Errorf("%q does not say %q", l, what)
			}
		case servicePortLine.MatchString(l) && !strings.Contains(l, ": equal"):
			t.Errorf("unexpected difference: %s", l)
		}
	}
	if !found {
		t.Errorf("no line starting with %q", want)
	}
}
