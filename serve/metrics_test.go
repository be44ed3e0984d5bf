package serve

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// scrape returns m's /metrics page.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler("nftables"))
	defer srv.Close()
	return fetch(t, srv.URL+"/metrics")
}

// sampleValue is the value of the series of family name with the label
// name=value pairs labels (all of its labels), from m's registry; the test
// fails if there is none.
func sampleValue(t *testing.T, m *Metrics, name string, labels ...string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			if len(s.GetLabel())*2 != len(labels) {
				continue
			}
			for i, l := range s.GetLabel() {
				if l.GetName() != labels[2*i] || l.GetValue() != labels[2*i+1] {
					continue series
				}
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s %v", name, labels)
	return 0
}

// metricLines returns the lines of body for the metric family name (its
// HELP and TYPE lines and samples, buckets included).
func metricLines(body, name string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		f := strings.TrimPrefix(strings.TrimPrefix(l, "# HELP "), "# TYPE ")
		if f == name || strings.HasPrefix(f, name+" ") || strings.HasPrefix(f, name+"{") ||
			strings.HasPrefix(f, name+"_bucket") || strings.HasPrefix(f, name+"_sum") || strings.HasPrefix(f, name+"_count") {
			out = append(out, l)
		}
	}
	return out
}

func wantLines(t *testing.T, what, body, name string, want ...string) {
	t.Helper()
	got := metricLines(body, name)
	for _, w := range want {
		found := false
		for _, l := range got {
			if l == w {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: /metrics lacks %q; %s lines:\n%s", what, w, name, strings.Join(got, "\n"))
		}
	}
}

// TestNetworkProgrammingBuckets: kube-proxy's buckets, 0 first.
func TestNetworkProgrammingBuckets(t *testing.T) {
	b := networkProgrammingBuckets()
	if len(b) != 1+2+59+12+7 {
		t.Fatalf("%d buckets, want 81: %v", len(b), b)
	}
	for i, want := range map[int]float64{0: 0, 1: 0.25, 2: 0.5, 3: 1, 61: 59, 62: 60, 73: 115, 74: 120, 75: 150, 80: 300} {
		if b[i] != want {
			t.Errorf("bucket %d = %v, want %v", i, b[i], want)
		}
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Errorf("buckets not increasing at %d: %v", i, b[i-1:i+1])
		}
	}
}

// TestNetworkProgrammingMetric: the trigger times handed over with a State
// are observed (now - trigger) once its sync succeeded, each of them, and
// dropped when it failed: the retry that programs them does not measure
// them (kube-proxy's rules).
func TestNetworkProgrammingMetric(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d ...time.Duration) []model.Trigger {
		out := make([]model.Trigger, len(d))
		for i, x := range d {
			out[i] = model.Trigger{At: now.Add(-x), Family: model.IPv4}
		}
		return out
	}
	type sync struct {
		triggers []model.Trigger
		fail     bool
	}
	tests := []struct {
		name  string
		syncs []sync
		count int
		sum   float64
		// buckets: le value -> cumulative count
		buckets map[string]int
	}{{
		name:    "one change, one sync",
		syncs:   []sync{{triggers: ago(1500 * time.Millisecond)}},
		count:   1,
		sum:     1.5,
		buckets: map[string]int{"1": 0, "2": 1, "+Inf": 1},
	}, {
		name:    "every trigger time of a sync is observed",
		syncs:   []sync{{triggers: ago(200*time.Millisecond, 3*time.Second, 90*time.Second)}},
		count:   3,
		sum:     93.2,
		buckets: map[string]int{"0": 0, "0.25": 1, "3": 2, "85": 2, "90": 3},
	}, {
		name:  "a failed sync drops its trigger times",
		syncs: []sync{{triggers: ago(time.Second), fail: true}, {}},
		count: 0,
	}, {
		name:    "only the changes of the successful sync",
		syncs:   []sync{{triggers: ago(time.Second), fail: true}, {triggers: ago(2 * time.Second)}},
		count:   1,
		sum:     2,
		buckets: map[string]int{"1": 0, "2": 1},
	}, {
		name:    "a sync without changes observes nothing more",
		syncs:   []sync{{triggers: ago(time.Second)}, {}, {}},
		count:   1,
		sum:     1,
		buckets: map[string]int{"1": 1},
	}, {
		name:    "beyond five minutes: +Inf only",
		syncs:   []sync{{triggers: ago(10 * time.Minute)}},
		count:   1,
		sum:     600,
		buckets: map[string]int{"300": 0, "+Inf": 1},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics()
			m.now = func() time.Time { return now }
			for _, s := range tc.syncs {
				m.Syncing(s.triggers)
				var err error
				if s.fail {
					err = errTest
				}
				m.Observe(proxier.SyncResult{}, time.Millisecond, err)
			}
			const name = "kubeproxy_network_programming_duration_seconds"
			body := scrape(t, m)
			var want []string
			if tc.count > 0 { // a family's series, and so the family, exist once observed
				want = append(want, "# HELP "+name+" [ALPHA] In Cluster Network Programming Latency in seconds",
					"# TYPE "+name+" histogram",
					fmt.Sprintf(`%s_count{ip_family="IPv4"} %d`, name, tc.count),
					fmt.Sprintf(`%s_sum{ip_family="IPv4"} %g`, name, tc.sum))
			} else if got := metricLines(body, name); len(got) > 0 {
				t.Errorf("nothing observed, yet /metrics has %q", got)
			}
			for le, n := range tc.buckets {
				want = append(want, fmt.Sprintf(`%s_bucket{ip_family="IPv4",le="%s"} %d`, name, le, n))
			}
			wantLines(t, tc.name, body, name, want...)
		})
	}
}

// TestChangeMetrics: the four change metrics, with kube-proxy's names,
// help and types, read from the source at each scrape; 0 without one.
func TestChangeMetrics(t *testing.T) {
	tests := []struct {
		name   string
		source func() model.ChangeCounts
		want   [4]int // endpoint pending, endpoint total, service pending, service total
	}{
		{name: "no source (file mode)", want: [4]int{0, 0, 0, 0}},
		{name: "a source", source: func() model.ChangeCounts {
			return model.ChangeCounts{ServiceChanges: 7, EndpointChanges: 12, ServicesPending: 2, EndpointChangesPending: 3}
		}, want: [4]int{3, 12, 2, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics()
			if tc.source != nil {
				m.CountChanges(tc.source)
			}
			body := scrape(t, m)
			for i, mt := range []struct{ name, typ, help string }{
				{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge", "Pending proxy rules Endpoint changes"},
				{"kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter", "Cumulative proxy rules Endpoint changes"},
				{"kubeproxy_sync_proxy_rules_service_changes_pending", "gauge", "Pending proxy rules Service changes"},
				{"kubeproxy_sync_proxy_rules_service_changes_total", "counter", "Cumulative proxy rules Service changes"},
			} {
				wantLines(t, tc.name, body, mt.name,
					"# HELP "+mt.name+" [ALPHA] "+mt.help,
					"# TYPE "+mt.name+" "+mt.typ,
					fmt.Sprintf("%s %d", mt.name, tc.want[i]))
			}
		})
	}
	// Read at scrape time: a source that moves is followed.
	m := NewMetrics()
	n := model.ChangeCounts{}
	m.CountChanges(func() model.ChangeCounts { return n })
	n.ServiceChanges, n.ServicesPending = 5, 1
	wantLines(t, "after the source moved", scrape(t, m), "kubeproxy_sync_proxy_rules_service_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_total 5")
}
