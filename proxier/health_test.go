package proxier

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
	steps := []struct {
		name           string
		do             func()
		healthz, livez int
	}{
		{"never synced: not ready", func() {}, 503, 200},
		{"queued, within the timeout, never synced", func() { h.Queued(); now = now.Add(30 * time.Second) }, 503, 200},
		{"queued, past the timeout", func() { now = now.Add(31 * time.Second) }, 503, 503},
		{"synced", func() { h.Updated() }, 200, 200},
		{"queued again later: the clock starts anew", func() { now = now.Add(time.Hour); h.Queued() }, 200, 200},
		{"synced again", func() { h.Updated() }, 200, 200},
		{"source failing, within the timeout", func() { h.SourceFailing(errors.New("API down")); now = now.Add(59 * time.Second) }, 200, 200},
		{"source failing past the timeout: /healthz only", func() { h.SourceFailing(errors.New("API down")); now = now.Add(2 * time.Second) }, 503, 200},
		{"source fine again", func() { h.SourceOK() }, 200, 200},
		{"drift repaired: shown, still healthy", func() { h.Drifted() }, 200, 200},
		{"node being removed: /healthz only", func() { h.SetNodeEligible(false) }, 503, 200},
	}
	for _, s := range steps {
		s.do()
		if code, body := get("/healthz"); code != s.healthz || body["nodeEligible"] == nil || body["lastUpdated"] == nil {
			t.Errorf("%s: /healthz %d %v, want %d with lastUpdated and nodeEligible", s.name, code, body, s.healthz)
		}
		if code, body := get("/livez"); code != s.livez || body["currentTime"] == nil {
			t.Errorf("%s: /livez %d %v, want %d", s.name, code, body, s.livez)
		}
	}
}

func TestMetrics(t *testing.T) {
	m := NewMetrics()
	m.Observe(SyncResult{Full: true}, 2*time.Second, nil)
	m.Observe(SyncResult{}, time.Millisecond, nil)
	m.Observe(SyncResult{}, 0, errTest)
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		"kubeproxy_sync_proxy_rules_duration_seconds_count 2",
		"kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1",
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total 1",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds ",
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
	st := NewState()
	st.Node = Node{Name: "node-1"}
	add := func(name string, itp, etp bool, node string) {
		n := ServicePortName{Namespace: "ns", Name: name}
		st.Services = st.Services.With(n, &ServicePort{Name: n, Protocol: TCP, Port: 80, NodePort: 30000, InternalPolicyLocal: itp, ExternalPolicyLocal: etp})
		st.Endpoints = st.Endpoints.With(n, []Endpoint{{Port: 80, NodeName: node, Ready: true, Serving: true}})
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
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"} 1`,
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

// The body explains a 503: the source's error and since when, the drift
// repairs.
func TestHealthBodyExplains(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth(time.Minute)
	h.now = func() time.Time { return now }
	h.Updated()
	h.SourceFailing(errors.New("dial tcp 127.0.0.1:1: connection refused"))
	h.Drifted()
	rec := httptest.NewRecorder()
	h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["sourceError"] != "dial tcp 127.0.0.1:1: connection refused" || body["sourceFailingSince"] == nil ||
		body["driftRepairs"] != 1.0 || body["lastDriftRepaired"] == nil || body["synced"] != true {
		t.Errorf("body %s lacks the source error, its start, the drift repairs or synced", rec.Body.String())
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
	get("/healthz", 503) // never synced
	get("/healthz", 503)
	get("/livez", 200)
	h.Updated()
	get("/healthz", 200)
	h.Queued()
	now = now.Add(2 * time.Minute)
	get("/livez", 503)
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		"# HELP kubeproxy_proxy_healthz_total Cumulative proxy healthz HTTP status\n# TYPE kubeproxy_proxy_healthz_total counter\n",
		"# HELP kubeproxy_proxy_livez_total Cumulative proxy livez HTTP status\n# TYPE kubeproxy_proxy_livez_total counter\n",
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
