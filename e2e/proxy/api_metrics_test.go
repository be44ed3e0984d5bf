package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	apiMetricsName = "api-metrics"
	apiMetricsIP   = "10.96.1.40"

	metricProgramming  = "kubeproxy_network_programming_duration_seconds"
	metricEPTotal      = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
	metricEPPending    = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	metricSvcTotal     = "kubeproxy_sync_proxy_rules_service_changes_total"
	metricSvcPending   = "kubeproxy_sync_proxy_rules_service_changes_pending"
	metricsURL         = "http://127.0.0.1:10249/metrics" // the default --metrics-bind-address, in the node namespace
	apiMetricsDeadline = 10 * time.Second
)

// TestAPIMetrics checks kube-proxy's change metrics on the proxy's
// /metrics against a real API server: an EndpointSlice carrying the
// endpoints.kubernetes.io/last-change-trigger-time annotation is observed
// in kubeproxy_network_programming_duration_seconds once programmed, with
// now - trigger time as its value; one without the annotation is not; the
// Service and EndpointSlice change totals move with every event and the
// pending gauges go back to 0 once a sync took the changes.
func TestAPIMetrics(t *testing.T) {
	t.Parallel()
	a := newAPIEnv(t)
	scrape := a.metricsScraper(t)
	addr := hostPort(apiMetricsIP, webPort)

	before := scrape(t)
	// A trigger time just before the request, as the EndpointSlice
	// controller would set it for the Pod change that caused the slice.
	trigger := time.Now()
	a.do(t, "POST", servicesPath, apiService(apiMetricsName, apiMetricsIP, nil), nil)
	a.do(t, "POST", slicesPath, annotated(apiSlice(apiMetricsName, nil, podA), trigger), nil)
	a.waitTraffic(t, trigger, 5*time.Second, addr, podA.Name)
	created := a.waitMetrics(t, "the created Service and EndpointSlice", func(m metrics) error {
		return m.settled(before, 1)
	})
	if got := created[metricSvcTotal] - before[metricSvcTotal]; got < 1 {
		t.Errorf("%s moved by %v after creating a Service, want >= 1", metricSvcTotal, got)
	}
	if got := created[metricEPTotal] - before[metricEPTotal]; got < 1 {
		t.Errorf("%s moved by %v after creating an EndpointSlice, want >= 1", metricEPTotal, got)
	}
	checkLatency(t, "created slice", created.sum()-before.sum(), 0, time.Since(trigger))

	// An update without the annotation is a change, but nothing to
	// measure; one with an earlier trigger time (the first one: trigger
	// times from before the proxy started are not measured) is measured
	// from then, not from when it arrived. After both, the histogram has
	// exactly one more observation.
	a.setSliceEndpoints(t, apiMetricsName, podA, podB)
	a.waitTraffic(t, time.Now(), 5*time.Second, addr, podA.Name, podB.Name)
	unannotated := a.waitMetrics(t, "the unannotated update", func(m metrics) error {
		if m[metricEPTotal] <= created[metricEPTotal] {
			return fmt.Errorf("%s still %v", metricEPTotal, m[metricEPTotal])
		}
		return m.settled(created, 0)
	})
	var cur discoveryv1.EndpointSlice
	a.do(t, "GET", slicesPath+"/"+apiMetricsName+"-ipv4", nil, &cur)
	es := annotated(apiSlice(apiMetricsName, nil, podB), trigger)
	es.ResourceVersion = cur.ResourceVersion
	sent := time.Now()
	a.do(t, "PUT", slicesPath+"/"+apiMetricsName+"-ipv4", es, nil)
	a.waitTraffic(t, time.Now(), 5*time.Second, addr, podB.Name)
	updated := a.waitMetrics(t, "the annotated update", func(m metrics) error {
		return m.settled(created, 1)
	})
	if unannotated.count() != created.count() {
		t.Errorf("%s_count moved from %v to %v for an update without the annotation", metricProgramming, created.count(), unannotated.count())
	}
	checkLatency(t, "updated slice", updated.sum()-unannotated.sum(), sent.Sub(trigger), time.Since(trigger))
	if got := updated[metricEPTotal] - before[metricEPTotal]; got < 3 {
		t.Errorf("%s moved by %v after a create and two updates, want >= 3", metricEPTotal, got)
	}
	t.Logf("MEASURED network programming: created slice %.3fs; update sent %v after its trigger time: %.3fs",
		created.sum()-before.sum(), sent.Sub(trigger).Round(time.Millisecond), updated.sum()-unannotated.sum())
	a.proxy.checkRunning(t)
}

// annotated sets the trigger-time annotation of es to at.
func annotated(es *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
	return es
}

// checkLatency wants an observed network programming latency between min
// and max.
func checkLatency(t *testing.T, what string, got float64, min, max time.Duration) {
	t.Helper()
	if got < min.Seconds() || got > max.Seconds() {
		t.Errorf("%s: network programming latency %.3fs, want between %v and %v", what, got, min, max.Round(time.Millisecond))
	}
}

// metrics are the samples of one scrape, by name with labels as printed.
type metrics map[string]float64

func (m metrics) count() float64 { return m[metricProgramming+"_count"] }
func (m metrics) sum() float64   { return m[metricProgramming+"_sum"] }

// settled returns nil once the histogram has n observations more than in
// since and no change is pending.
func (m metrics) settled(since metrics, n float64) error {
	for _, name := range []string{metricProgramming + "_count", metricEPTotal, metricEPPending, metricSvcTotal, metricSvcPending} {
		if _, ok := m[name]; !ok {
			return fmt.Errorf("/metrics has no %s", name)
		}
	}
	if got := m.count() - since.count(); got != n {
		return fmt.Errorf("%s_count moved by %v, want %v", metricProgramming, got, n)
	}
	if m[metricEPPending] != 0 || m[metricSvcPending] != 0 {
		return fmt.Errorf("changes pending: %v endpoint, %v service", m[metricEPPending], m[metricSvcPending])
	}
	return nil
}

// waitMetrics scrapes until cond accepts a scrape, and returns it.
func (a *apiEnv) waitMetrics(t *testing.T, what string, cond func(metrics) error) metrics {
	t.Helper()
	var last metrics
	a.proxy.poll(t, apiMetricsDeadline, "/metrics after "+what, func(ctx context.Context) error {
		m, err := a.fetchMetrics(ctx)
		if err != nil {
			return err
		}
		last = m
		return cond(m)
	})
	return last
}

// metricsScraper returns a function that scrapes the proxy's /metrics,
// failing the test if it cannot.
func (a *apiEnv) metricsScraper(t *testing.T) func(*testing.T) metrics {
	return func(t *testing.T) metrics {
		t.Helper()
		var m metrics
		a.proxy.poll(t, apiMetricsDeadline, "/metrics", func(ctx context.Context) error {
			var err error
			m, err = a.fetchMetrics(ctx)
			return err
		})
		return m
	}
}

// fetchMetrics GETs /metrics from inside the node namespace, where the
// proxy listens on loopback.
func (a *apiEnv) fetchMetrics(ctx context.Context) (metrics, error) {
	client := httpClientIn(a.sb.NS(sandbox.Node))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", metricsURL, resp.Status)
	}
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("unexpected /metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		m[line[:i]] = v
		// Per-family series (ip_family="IPv4", ...) also add up under the
		// family's name, for the families this test reads.
		if name, labels, ok := strings.Cut(line[:i], "{"); ok && strings.HasPrefix(labels, `ip_family="`) && !strings.Contains(labels, ",") {
			m[name] += v
		}
	}
	return m, sc.Err()
}

// httpClientIn is an HTTP client whose connections start inside network
// namespace ns (a full name, as Sandbox.NS gives it).
func httpClientIn(ns string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetNS(ctx, ns, network, addr)
		},
	}}
}

// dialInNetNS opens a connection from inside the named network namespace:
// the socket is created on a thread switched into it (and back), and stays
// in that namespace whichever thread uses it later. addr must be an IP
// literal, so that no resolver goroutine runs elsewhere.
func dialInNetNS(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	target, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		return nil, err
	}
	defer target.Close()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the runtime discards the thread with this goroutine.
			if c != nil {
				c.Close()
			}
			done <- result{err: errors.Join(err, fmt.Errorf("setns back from %s: %w", ns, serr))}
			return
		}
		runtime.UnlockOSThread()
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}
