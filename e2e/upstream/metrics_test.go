package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

// endpoint is one proxy's metrics and health servers, reached inside its
// network namespace.
type endpoint struct {
	name            string
	proc            *process
	client          *http.Client
	metrics, health string // host:port
}

func (p *endpoint) get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	code, body, err := p.tryGet(t.Context(), addr, path)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

func (p *endpoint) tryGet(ctx context.Context, addr, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("%s: GET %s: %w", p.name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("%s: reading %s: %w", p.name, path, err)
	}
	return resp.StatusCode, string(b), nil
}

// families scrapes /metrics and parses it.
func (p *endpoint) families(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := p.get(t, p.metrics, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("%s: /metrics: %d: %s", p.name, code, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: parsing /metrics: %v", p.name, err)
	}
	return fams
}

// syncs is the number of successful syncs /metrics counts (0 while it
// does not answer).
func (p *endpoint) syncs(t *testing.T) uint64 {
	if _, _, err := p.tryGet(t.Context(), p.metrics, "/metrics"); err != nil {
		return 0
	}
	f := p.families(t)["kubeproxy_sync_proxy_rules_duration_seconds"]
	if f == nil {
		return 0
	}
	var n uint64
	for _, m := range f.GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// proxyPair is upstream kube-proxy and ours, in one mode, against one
// API server holding featureServices.
type proxyPair struct {
	up, ours *endpoint
	srv      *apiserver.Server
	dir      string
}

// startPair starts both proxies in mode with extra flags, and waits until
// each has synced at least twice (a full and a partial sync).
func startPair(t *testing.T, mode string, extra ...string) *proxyPair {
	kubeProxy := needTools(t)
	dir := t.TempDir()
	ours, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := legacyBin(t, dir)
	apiNS, upNS, ouNS := netns(t, "knp-api-"), netns(t, "knp-up-"), netns(t, "knp-ou-")
	link(t, apiNS, upNS, "10.123.1.1", "10.123.1.2")
	link(t, apiNS, ouNS, "10.123.2.1", "10.123.2.2")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: apiNS, ExtraArgs: []string{"--bind-address=0.0.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{t: t, dir: dir, srv: srv, ours: ours, upNS: upNS, ouNS: ouNS}
	createObjects(e)
	taken := map[int]bool{}
	side := func(name, ns, binary, apiAddr string, env []string) *endpoint {
		p := &endpoint{name: name, client: &http.Client{Transport: &http.Transport{DialContext: apiserver.DialerInNetNS(ns)}},
			metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken)), health: fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken))}
		args := append([]string{binary, "--proxy-mode=" + mode, "--kubeconfig", kubeconfigVia(t, srv, apiAddr, dir),
			"--hostname-override", localNode, "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
			"--metrics-bind-address", p.metrics, "--healthz-bind-address", p.health,
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--iptables-min-sync-period=100ms"}, extra...)
		p.proc = start(t, name, ns, filepath.Join(dir, name+".log"), env, args...)
		return p
	}
	pair := &proxyPair{srv: srv, dir: dir,
		up:   side("kube-proxy", upNS, kubeProxy, "10.123.1.1", []string{"PATH=" + bin + ":" + os.Getenv("PATH")}),
		ours: side("kube-nftproxy", ouNS, ours, "10.123.2.1", nil)}
	for _, p := range []*endpoint{pair.up, pair.ours} {
		waitFor(t, p, 90*time.Second, "two syncs", func() bool { return p.syncs(t) >= 2 })
	}
	return pair
}

// legacyBin is a directory of iptables-legacy under the names kube-proxy runs.
func legacyBin(t *testing.T, dir string) string {
	bin := filepath.Join(dir, "legacy-bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range legacyTools {
		target, _ := exec.LookPath(strings.Replace(tool, "tables", "tables-legacy", 1))
		if err := os.Symlink(target, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// createObjects creates the nodes and featureServices with their slices.
func createObjects(e *testEnv) {
	for _, n := range []*corev1.Node{
		node(localNode, "10.99.0.1", "fd00:99::1", "10.244.0.0/24", "fd00:10:244::/64"),
		node(remoteNode, "10.99.0.2", "fd00:99::2", "10.244.1.0/24", "fd00:10:244:1::/64"),
	} {
		status := n.Status
		var created corev1.Node
		e.do("POST", "/api/v1/nodes", n, &created)
		created.Status = status
		e.do("PUT", "/api/v1/nodes/"+n.Name+"/status", &created, nil)
	}
	for _, s := range featureServices() {
		var created corev1.Service
		e.do("POST", "/api/v1/namespaces/default/services", s.object(), &created)
		if s.lbIngress != "" {
			created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.lbIngress}}
			e.do("PUT", "/api/v1/namespaces/default/services/"+s.name+"/status", &created, nil)
		}
		for _, es := range s.slices() {
			e.do("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", es, nil)
		}
	}
}

// waitFor polls cond until it holds, failing after d or if p exits.
func waitFor(t *testing.T, p *endpoint, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if err := p.proc.exited(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %s", p.name, what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shape is what the test compares of a metric family: its type, its label
// names (all series together, without a histogram's le) and the stability
// prefix of its help ("[ALPHA]", "[STABLE]", ...; "" without one).
type shape struct {
	typ       string
	labels    string
	stability string
}

func (s shape) String() string { return fmt.Sprintf("%s {%s} %s", s.typ, s.labels, s.stability) }

func shapes(fams map[string]*dto.MetricFamily) map[string]shape {
	out := map[string]shape{}
	for name, f := range fams {
		seen := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				seen[l.GetName()] = true
			}
		}
		labels := make([]string, 0, len(seen))
		for l := range seen {
			labels = append(labels, l)
		}
		sort.Strings(labels)
		stability := ""
		if h := f.GetHelp(); strings.HasPrefix(h, "[") {
			stability = h[:strings.Index(h, "]")+1]
		}
		out[name] = shape{typ: strings.ToLower(f.GetType().String()), labels: strings.Join(labels, ","), stability: stability}
	}
	return out
}

// dumpEndpoints saves what both sides serve, for a reader of a failure.
func (pp *proxyPair) dumpEndpoints(t *testing.T) {
	for _, p := range []*endpoint{pp.up, pp.ours} {
		for _, path := range []string{"/metrics", "/healthz", "/livez", "/readyz", "/configz", "/flagz", "/statusz", "/proxyMode"} {
			for _, addr := range []string{p.metrics, p.health} {
				code, body := p.get(t, addr, path)
				t.Logf("%s %s%s: %d\n%s", p.name, addr, path, code, body)
			}
		}
	}
}

func TestUpstreamMetricsExplore(t *testing.T) {
	pp := startPair(t, "nftables")
	pp.dumpEndpoints(t)
	up, ours := shapes(pp.up.families(t)), shapes(pp.ours.families(t))
	names := map[string]bool{}
	for n := range up {
		names[n] = true
	}
	for n := range ours {
		names[n] = true
	}
	sorted := slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range sorted {
		u, uok := up[n]
		o, ook := ours[n]
		t.Logf("%-70s up=%v ours=%v | %v | %v", n, uok, ook, u, o)
	}
}
