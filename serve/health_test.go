package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

func TestHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	get := func(path string) (int, map[string]any) {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %q: %v", path, rec.Body.String(), err)
		}
		return rec.Code, body
	}
	// kube-proxy's codes for /healthz and /livez (200 before the first
	// sync; only a late sync or an ineligible node fail them); /readyz,
	// ours, also waits for the first sync and a source that reads.
	steps := []struct {
		name                  string
		do                    func()
		healthz, livez, ready int
	}{
		{"never synced: healthy, not ready", func() {}, 200, 200, 503},
		{"queued, within the timeout, never synced", func() { h.Queued(); now = now.Add(30 * time.Second) }, 200, 200, 503},
		{"queued past the timeout, never synced: still healthy (kube-proxy judges a family once synced)", func() { now = now.Add(31 * time.Second) }, 200, 200, 503},
		{"synced", func() { h.Updated() }, 200, 200, 200},
		{"queued, past the timeout", func() { h.Queued(); now = now.Add(61 * time.Second) }, 503, 503, 503},
		{"synced again", func() { h.Updated() }, 200, 200, 200},
		{"queued again later: the clock starts anew", func() { now = now.Add(time.Hour); h.Queued() }, 200, 200, 200},
		{"synced again", func() { h.Updated() }, 200, 200, 200},
		{"source failing, within the timeout", func() { h.SourceFailing("api"); now = now.Add(59 * time.Second) }, 200, 200, 200},
		{"source failing past the timeout: /readyz only", func() { h.SourceFailing("api"); now = now.Add(2 * time.Second) }, 200, 200, 503},
		{"source fine again", func() { h.SourceOK() }, 200, 200, 200},
		{"drift repaired: shown, still healthy", func() { h.Drifted() }, 200, 200, 200},
		{"syncs failing, within the sync period", func() { h.SyncFailed(); now = now.Add(29 * time.Second); h.SyncFailed() }, 200, 200, 200},
		{"syncs failing past the sync period: /readyz only", func() { now = now.Add(2 * time.Second) }, 200, 200, 503},
		{"a sync succeeds", func() { h.Updated() }, 200, 200, 200},
		{"failing again: the clock starts anew", func() { h.SyncFailed(); now = now.Add(10 * time.Second) }, 200, 200, 200},
		{"synced", func() { h.Updated() }, 200, 200, 200},
		{"node being removed: /healthz and /readyz", func() { h.SetNodeEligible(false) }, 503, 200, 503},
	}
	for _, s := range steps {
		s.do()
		code, body := get("/healthz")
		if code != s.healthz || body["nodeEligible"] == nil || body["lastUpdated"] == nil || body["healthy"] == nil || body["status"] == nil {
			t.Errorf("%s: /healthz %d %v, want %d with lastUpdated, nodeEligible, healthy and status", s.name, code, body, s.healthz)
		}
		if code, body := get("/livez"); code != s.livez || body["currentTime"] == nil || body["nodeEligible"] != nil {
			t.Errorf("%s: /livez %d %v, want %d, without nodeEligible", s.name, code, body, s.livez)
		}
		if code, body := get("/readyz"); code != s.ready || body["synced"] == nil {
			t.Errorf("%s: /readyz %d %v, want %d with synced", s.name, code, body, s.ready)
		}
	}
}

// /healthz's body as kube-proxy's: lastUpdated is now while healthy, the
// last sync otherwise; status has each family's last sync and health.
func TestHealthBodyUpstreamFields(t *testing.T) {
	now := time.Unix(1000, 0).UTC()
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	body := func() (int, healthBody) {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var b healthBody
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		return rec.Code, b
	}
	if code, b := body(); code != 200 || !b.Healthy || len(b.Status) != 0 || !b.LastUpdated.Equal(now) {
		t.Errorf("before the first sync: %d %+v, want 200, healthy, no status, lastUpdated now", code, b)
	}
	synced := now
	h.Updated()
	now = now.Add(10 * time.Second)
	code, b := body()
	want := familyHealth{LastUpdated: synced, Healthy: true}
	if code != 200 || !b.LastUpdated.Equal(now) || !b.CurrentTime.Equal(now) || b.Status[model.IPv4] != want || b.Status[model.IPv6] != want {
		t.Errorf("healthy: %d %+v, want lastUpdated now and status %+v per family", code, b, want)
	}
	h.Queued()
	now = now.Add(2 * time.Minute)
	code, b = body()
	want.Healthy = false
	if code != 503 || b.Healthy || !b.LastUpdated.Equal(synced) || b.Status[model.IPv4] != want || b.Status[model.IPv6] != want {
		t.Errorf("late sync: %d %+v, want 503, lastUpdated the last sync, status %+v", code, b, want)
	}
}

func TestMetrics(t *testing.T) {
	m := NewMetrics()
	m.Observe(proxier.SyncResult{Full: true}, 2*time.Second, nil)
	m.Observe(proxier.SyncResult{}, time.Millisecond, nil)
	m.Observe(proxier.SyncResult{}, 0, errTest)
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} `,
		"# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if mode := fetch(t, srv.URL+"/proxyMode"); mode != "nftables" {
		t.Errorf("/proxyMode = %q", mode)
	}
}

var errTest = io.ErrUnexpectedEOF

func TestNoLocalEndpointsMetric(t *testing.T) {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	add := func(name string, itp, etp bool, node string) {
		n := model.ServicePortName{Namespace: "ns", Name: name}
		st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.TCP, Port: 80, NodePort: 30000, InternalPolicyLocal: itp, ExternalPolicyLocal: etp})
		st.Endpoints = st.Endpoints.With(n, []model.Endpoint{{Port: 80, NodeName: node, Ready: true, Serving: true}})
	}
	add("itp-remote", true, false, "node-2")
	add("etp-remote", false, true, "node-2")
	add("etp-local", false, true, "node-1")
	add("cluster", false, false, "node-2")
	m := NewMetrics()
	m.CountNoLocalEndpoints(st)
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The body explains a 503: which source fails and since when, the drift
// repairs; never the source's error, which names files and the API
// server's address to anyone who reaches the port.
func TestHealthBodyExplains(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	h.Updated()
	var logged lockedBuffer
	m := NewMetrics()
	src := NewSourceStatus("file", slog.New(slog.NewTextHandler(&logged, nil)), time.Minute, h, m)
	secret := "open /etc/secret-state/svc.yaml: dial tcp 10.0.0.9:6443: connection refused"
	src.Failing(errors.New(secret))
	h.Drifted()
	for _, path := range []string{"/readyz", "/healthz", "/livez"} {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if body["sourceFailing"] != "file" || body["sourceFailingSince"] == nil ||
			body["driftRepairs"] != 1.0 || body["lastDriftRepaired"] == nil {
			t.Errorf("%s: body %s lacks the failing source, its start or the drift repairs", path, rec.Body.String())
		}
		if path == "/readyz" && body["synced"] != true {
			t.Errorf("%s: body %s lacks synced", path, rec.Body.String())
		}
		for _, leak := range []string{"secret-state", "10.0.0.9", "6443", "refused"} {
			if strings.Contains(rec.Body.String(), leak) {
				t.Errorf("%s: body %s shows the source's error (%q)", path, rec.Body.String(), leak)
			}
		}
	}
	// The detail goes to the log and the metrics instead.
	if !strings.Contains(logged.String(), "secret-state/svc.yaml") {
		t.Errorf("the log lacks the source's error:\n%s", logged.String())
	}
	if !strings.Contains(scrape(t, m), `kubenftproxy_source_failures_total{source="file"} 1`) {
		t.Errorf("the metrics do not count the source's failure")
	}
}

// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total count each
// answer of /healthz and /livez by code, with kube-proxy's names and help.
func TestHealthProbeMetrics(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	m := NewMetrics()
	h.Answered = m.CountProbe
	get := func(path string, want int) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want {
			t.Fatalf("%s: %d, want %d", path, rec.Code, want)
		}
	}
	get("/healthz", 200) // never synced: healthy, as kube-proxy
	h.SetNodeEligible(false)
	get("/healthz", 503)
	get("/healthz", 503)
	get("/readyz", 503) // not counted
	get("/livez", 200)
	h.Updated()
	h.Queued()
	now = now.Add(2 * time.Minute)
	get("/livez", 503)
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		"# HELP kubeproxy_proxy_healthz_total [ALPHA] Cumulative proxy healthz HTTP status\n# TYPE kubeproxy_proxy_healthz_total counter\n",
		"# HELP kubeproxy_proxy_livez_total [ALPHA] Cumulative proxy livez HTTP status\n# TYPE kubeproxy_proxy_livez_total counter\n",
		`kubeproxy_proxy_healthz_total{code="200"} 1` + "\n",
		`kubeproxy_proxy_healthz_total{code="503"} 2` + "\n",
		`kubeproxy_proxy_livez_total{code="200"} 1` + "\n",
		`kubeproxy_proxy_livez_total{code="503"} 1` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// SyncFailed says once per run of failures that the run has outlasted
// FailTimeout, so that the caller logs it once.
func TestHealthSyncFailedOverdueOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth(time.Minute)
	h.FailTimeout = 5 * time.Second
	h.now = func() time.Time { return now }
	var got []bool
	for _, step := range []time.Duration{0, 4, 1, 1, 1} {
		now = now.Add(step * time.Second)
		got = append(got, h.SyncFailed())
	}
	h.Updated()
	for _, step := range []time.Duration{0, 6} {
		now = now.Add(step * time.Second)
		got = append(got, h.SyncFailed())
	}
	if want := "[false false true false false false true]"; fmt.Sprint(got) != want {
		t.Errorf("SyncFailed overdue answers %v, want %s", got, want)
	}
}
