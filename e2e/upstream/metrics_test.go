package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	env      *testEnv
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
	e := newTestEnv(t, dir, ours)
	createObjects(e)
	taken := map[int]bool{}
	side := func(name, ns, binary, apiAddr string, env []string) *endpoint {
		p := &endpoint{name: name, client: &http.Client{Transport: &http.Transport{DialContext: apiserver.DialerInNetNS(ns)}},
			metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken)), health: fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken))}
		args := append([]string{binary, "--proxy-mode=" + mode, "--kubeconfig", kubeconfigVia(t, e.srv, apiAddr, dir),
			"--hostname-override", localNode, "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
			"--metrics-bind-address", p.metrics, "--healthz-bind-address", p.health,
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--iptables-min-sync-period=100ms"}, extra...)
		p.proc = start(t, name, ns, filepath.Join(dir, name+".log"), env, args...)
		return p
	}
	pair := &proxyPair{srv: e.srv, dir: dir, env: e,
		up:   side("kube-proxy", e.upNS, kubeProxy, "10.123.1.1", []string{"PATH=" + bin + ":" + os.Getenv("PATH")}),
		ours: side("kube-nftproxy", e.ouNS, ours, "10.123.2.1", nil)}
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
// names (all series together, without a histogram's le), its help (with
// the stability prefix, "[ALPHA] " ...) and a histogram's buckets.
type shape struct {
	typ, labels, help, buckets string
}

func (s shape) String() string {
	return fmt.Sprintf("%s {%s} %q buckets [%s]", s.typ, s.labels, s.help, s.buckets)
}

func shapes(fams map[string]*dto.MetricFamily) map[string]shape {
	out := map[string]shape{}
	for name, f := range fams {
		seen := map[string]bool{}
		var buckets []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				seen[l.GetName()] = true
			}
			if h := m.GetHistogram(); h != nil && buckets == nil {
				for _, b := range h.GetBucket() {
					buckets = append(buckets, fmt.Sprint(b.GetUpperBound()))
				}
			}
		}
		labels := slices.Sorted(maps.Keys(seen))
		out[name] = shape{typ: strings.ToLower(f.GetType().String()), labels: strings.Join(labels, ","),
			help: f.GetHelp(), buckets: strings.Join(buckets, " ")}
	}
	return out
}

// difference is a family one side serves and the other does not, on
// purpose, and why.
type difference struct {
	side   string // "ours" or "upstream": the side that has it
	modes  string // the modes it applies to, "" for all
	reason string
}

// knownDifferences are the families only one side serves, deliberately.
// A family missing here and served by upstream only fails the test: a
// new upstream family must be implemented or listed.
var knownDifferences = map[string]difference{
	"kubenftproxy_source_failures_total":          {"ours", "", "ours: failures to read the source of Services"},
	"kubenftproxy_source_up":                      {"ours", "", "ours: whether the source of Services reads fine"},
	"kubenftproxy_drift_repairs_total":            {"ours", "", "ours: kernel rules rewritten after another process changed them"},
	"kubenftproxy_http_connections_dropped_total": {"ours", "", "ours: connections closed for the HTTP servers' caps"},
	"kubenftproxy_sync_failing":                   {"ours", "", "ours: 1 while syncs fail"},
	"kubenftproxy_leftover_removed_total":         {"ours", "", "ours: kube-proxy leftovers removed"},
	"kubenftproxy_conntrack_entries":              {"ours", "", "ours: the conntrack table's entries (nf_conntrack_count)"},
	"kubenftproxy_conntrack_entries_limit":        {"ours", "", "ours: the conntrack table's limit (nf_conntrack_max)"},

	"aggregator_discovery_aggregation_count_total":                 {"upstream", "", apiserverLib},
	"apiserver_audit_event_total":                                  {"upstream", "", apiserverLib},
	"apiserver_audit_requests_rejected_total":                      {"upstream", "", apiserverLib},
	"apiserver_envelope_encryption_dek_cache_fill_percent":         {"upstream", "", apiserverLib},
	"apiserver_storage_data_key_generation_duration_seconds":       {"upstream", "", apiserverLib},
	"apiserver_storage_data_key_generation_failures_total":         {"upstream", "", apiserverLib},
	"apiserver_storage_envelope_transformation_cache_misses_total": {"upstream", "", apiserverLib},
	"apiserver_validation_declarative_validation_mismatch_total":   {"upstream", "", apiserverLib},
	"apiserver_validation_declarative_validation_panic_total":      {"upstream", "", apiserverLib},
	"apiserver_validation_duplicate_validation_error_total":        {"upstream", "", apiserverLib},
	"apiserver_webhooks_x509_insecure_sha1_total":                  {"upstream", "", apiserverLib},
	"apiserver_webhooks_x509_missing_san_total":                    {"upstream", "", apiserverLib},

	"kubeproxy_sync_proxy_rules_iptables_total":                     {"upstream", "iptables", "iptables-restore rule counts per table: we write nftables, not iptables tables"},
	"kubeproxy_sync_proxy_rules_iptables_last":                      {"upstream", "iptables", "iptables-restore rule counts per table: we write nftables, not iptables tables"},
	"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     {"upstream", "iptables", "an nfacct counter of upstream's iptables rules; ours has no nfacct objects"},
	"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": {"upstream", "iptables", "an nfacct counter of upstream's iptables rules; ours has no nfacct objects"},
}

const apiserverLib = "registered at init by k8s.io/apiserver packages kube-proxy links; they never move in a proxy, and we do not link them"

// TestUpstreamMetricsFamilies: upstream kube-proxy v1.37.1 and ours, in
// nftables and iptables mode against one real API server, after the same
// syncs (full, then partial with a network programming trigger), serve the
// same metric families with the same types, label names, help (stability
// prefix included) and buckets, but for knownDifferences; and the same
// fields on /healthz and /livez, the same /configz shape and the metrics
// server's paths; and both record the same Starting event on their Node.
func TestUpstreamMetricsFamilies(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			pp := startPair(t, mode)
			pp.provokePartialSync(t)
			if testing.Verbose() {
				pp.dumpEndpoints(t)
			}
			compareFamilies(t, mode, shapes(pp.up.families(t)), shapes(pp.ours.families(t)))
			pp.compareHealth(t)
			pp.compareZPages(t)
			pp.compareStartingEvents(t)
		})
	}
}

// provokePartialSync changes an EndpointSlice with a trigger time after
// both proxies started, and waits until both have measured it (a partial
// sync, a network programming latency).
func (pp *proxyPair) provokePartialSync(t *testing.T) {
	e := &testEnv{t: t, srv: pp.srv}
	var slice map[string]any
	e.do("GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/np-ipv4", nil, &slice)
	md := slice["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	md["annotations"] = ann
	eps := slice["endpoints"].([]any)
	slice["endpoints"] = eps[:len(eps)-1]
	e.do("PUT", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/np-ipv4", slice, nil)
	for _, p := range []*endpoint{pp.up, pp.ours} {
		waitFor(t, p, 60*time.Second, "network programming latency", func() bool {
			return p.families(t)["kubeproxy_network_programming_duration_seconds"] != nil
		})
	}
}

func compareFamilies(t *testing.T, mode string, up, ours map[string]shape) {
	names := slices.Sorted(maps.Keys(up))
	for n := range ours {
		if _, ok := up[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		u, inUp := up[n]
		o, inOurs := ours[n]
		d, known := knownDifferences[n]
		applies := known && (d.modes == "" || d.modes == mode)
		switch {
		case inUp && inOurs:
			if u != o {
				t.Errorf("%s: upstream %v, ours %v", n, u, o)
			}
		case inUp && !(applies && d.side == "upstream"):
			t.Errorf("%s: upstream serves it (%v), we do not, and knownDifferences does not say why", n, u)
		case inOurs && !(applies && d.side == "ours"):
			t.Errorf("%s: we serve it (%v), upstream does not, and knownDifferences does not say why", n, o)
		case inUp:
			t.Logf("upstream only, deliberately: %s (%s)", n, d.reason)
		default:
			t.Logf("ours only, deliberately: %s (%s)", n, d.reason)
		}
	}
}

// jsonKeys are the keys of a JSON object, and of its "status" object's
// entries.
func jsonKeys(t *testing.T, who, body string) []string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%s: %q: %v", who, body, err)
	}
	keys := slices.Sorted(maps.Keys(m))
	var status map[string]map[string]any
	if raw, ok := m["status"]; ok && json.Unmarshal(raw, &status) == nil {
		for fam, v := range status {
			for k := range v {
				keys = append(keys, "status."+fam+"."+k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// ourExtraHealthFields are fields of our health bodies upstream lacks.
var ourExtraHealthFields = []string{"driftRepairs", "lastDriftRepaired", "sourceFailing", "sourceFailingSince", "synced"}

// compareHealth: /healthz and /livez answer with the same codes and
// fields (ours may add ourExtraHealthFields), and the metrics server's
// /healthz says the same.
func (pp *proxyPair) compareHealth(t *testing.T) {
	for _, path := range []string{"/healthz", "/livez"} {
		uc, ub := pp.up.get(t, pp.up.health, path)
		oc, ob := pp.ours.get(t, pp.ours.health, path)
		uk, ok := jsonKeys(t, "upstream "+path, ub), jsonKeys(t, "ours "+path, ob)
		ok = slices.DeleteFunc(ok, func(k string) bool { return slices.Contains(ourExtraHealthFields, k) })
		if uc != oc || !slices.Equal(uk, ok) {
			t.Errorf("%s: upstream %d %v, ours %d %v", path, uc, uk, oc, ok)
		}
	}
	uc, ub := pp.up.get(t, pp.up.metrics, "/healthz")
	oc, ob := pp.ours.get(t, pp.ours.metrics, "/healthz")
	if uc != oc || ub != ob {
		t.Errorf("metrics server's /healthz: upstream %d %q, ours %d %q", uc, ub, oc, ob)
	}
}

// compareZPages: /configz has upstream's shape (the same keys at every
// level), /flagz and /statusz answer, with the same first lines.
func (pp *proxyPair) compareZPages(t *testing.T) {
	_, ub := pp.up.get(t, pp.up.metrics, "/configz")
	_, ob := pp.ours.get(t, pp.ours.metrics, "/configz")
	if uk, ok := nestedKeys(t, ub), nestedKeys(t, ob); !slices.Equal(uk, ok) {
		t.Errorf("/configz keys differ:\nupstream %v\nours     %v", uk, ok)
	}
	for _, path := range []string{"/flagz", "/statusz"} {
		uc, ub := pp.up.get(t, pp.up.metrics, path)
		oc, ob := pp.ours.get(t, pp.ours.metrics, path)
		uLines, oLines := strings.Split(ub, "\n"), strings.Split(ob, "\n")
		if uc != http.StatusOK || oc != http.StatusOK || len(oLines) < 4 ||
			uLines[2] != oLines[2] || strings.Replace(uLines[1], "kube-proxy", "kube-nftproxy", 1) != oLines[1] {
			t.Errorf("%s: upstream %d %q, ours %d %q", path, uc, ub, oc, ob)
		}
	}
	_, ub = pp.up.get(t, pp.up.metrics, "/statusz")
	_, ob = pp.ours.get(t, pp.ours.metrics, "/statusz")
	if u, o := statuszField(ub, "Paths"), statuszField(ob, "Paths"); u != o {
		t.Errorf("/statusz Paths: upstream %q, ours %q", u, o)
	}
}

// statuszField is a /statusz line's value (upstream varies the separator
// between the name and the value, to discourage parsing).
func statuszField(body, name string) string {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name); ok && v != "" && strings.ContainsAny(v[:1], " :=") {
			return strings.TrimLeft(v, " :=")
		}
	}
	return ""
}

// nestedKeys are the paths of every key of a JSON document.
func nestedKeys(t *testing.T, body string) []string {
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	var keys []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok {
			for k, x := range m {
				keys = append(keys, prefix+k)
				walk(prefix+k+".", x)
			}
		}
	}
	walk("", v)
	slices.Sort(keys)
	return keys
}

// dumpEndpoints logs what both sides serve, for a reader of the test.
func (pp *proxyPair) dumpEndpoints(t *testing.T) {
	for _, p := range []*endpoint{pp.up, pp.ours} {
		for _, path := range []string{"/healthz", "/livez", "/readyz", "/configz", "/flagz", "/statusz", "/proxyMode"} {
			for _, addr := range []string{p.metrics, p.health} {
				code, body := p.get(t, addr, path)
				t.Logf("%s %s%s: %d %q", p.name, addr, path, code, body)
			}
		}
	}
}
