package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	// scaleServices Services with scaleEndpoints endpoints each are
	// created through the API before the proxy starts.
	scaleServices  = 5000
	scaleEndpoints = 10
	// scaleWorkers bounds the concurrent create requests.
	scaleWorkers = 16
	// scaleNewName is the Service created once the proxy has synced.
	scaleNewName = "scale-new"
)

// TestAPIScale measures, against a real kube-apiserver, the proxy's full
// sync of 5,000 Services with 10 endpoints each (created through the API
// before the proxy starts), and then the time from creating one more
// Service with 10 live endpoints to traffic reaching all of them. It is
// slow, so it runs only with KNP_SCALE=1. Its numbers are the lines
// starting with MEASURED.
func TestAPIScale(t *testing.T) {
	t.Parallel()
	if os.Getenv("KNP_SCALE") != "1" {
		t.Skip("skipping the API scale test: set KNP_SCALE=1 to run it")
	}
	needRoot(t)
	if err := apiserver.Available(); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skipf("skipping API server test: %v", err)
	}

	// Ten agent servers (pod-a, pod-b and s-0..s-7) for the new Service;
	// pod-c is the client.
	servers := []sandbox.Pod{podA, podB}
	for i := range scaleEndpoints - 2 {
		servers = append(servers, sandbox.NewPod(fmt.Sprintf("s-%d", i), 20+i))
	}
	e := &env{sb: newSandbox(t, append(slices.Clone(servers), podC))}
	for _, p := range servers {
		e.startServer(t, p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: e.sb.NS(sandbox.Node)})
	if err != nil {
		t.Fatal(err)
	}
	a := &apiEnv{env: e, srv: srv}
	do := scaleClient(srv)

	// Create the Services and their slices, each slice right after its
	// Service, by a bounded pool of workers.
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, scaleWorkers)
	for range scaleWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= scaleServices {
					return
				}
				name := fmt.Sprintf("scale-%04d", i)
				if err := do(t.Context(), "POST", servicesPath, scaleService(name), nil); err != nil {
					errs <- err
					return
				}
				if err := do(t.Context(), "POST", slicesPath, scaleSlice(name, fakeEndpoints(i)), nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	created := time.Since(t0)
	t.Logf("MEASURED created %d Services and %d EndpointSlices (%d endpoints) through the API with %d workers in %v (%.0f objects/s)",
		scaleServices, scaleServices, scaleServices*scaleEndpoints, scaleWorkers, created.Round(time.Millisecond),
		float64(2*scaleServices)/created.Seconds())

	// Start the proxy and wait for its full sync of all of them.
	start := time.Now()
	p := launchProxy(t, e.sb, 30*time.Second, proxyBin, "--proxy-mode=nftables",
		"--kubeconfig", srv.ProxyKubeconfig,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms",
		"-v=0",
	)
	e.proxy = p
	var synced string
	p.waitLog(t, 10*time.Minute, fmt.Sprintf("a full sync of %d+ Services", scaleServices), func(lines []string) bool {
		for _, l := range lines {
			if isSyncedLine(l) && strings.Contains(l, "full=true") && logInt(l, "services") >= scaleServices {
				synced = l
				return true
			}
		}
		return false
	})
	seen := time.Since(start)
	took, _ := time.ParseDuration(logField(synced, "took"))
	wall := seen
	if at, ok := logTime(synced); ok {
		wall = at.Sub(start)
	}
	var filled time.Duration
	for _, l := range p.log.lines() {
		if strings.Contains(l, "API server caches filled") {
			if at, ok := logTime(l); ok {
				filled = at.Sub(start)
			}
			break
		}
	}
	t.Logf("MEASURED proxy start -> synced full=true services=%d: %v by the log line's time (seen by the test after %v); "+
		"start -> caches filled: %v; the proxy's took=%v; messages=%d bytes=%d",
		logInt(synced, "services"), wall.Round(time.Millisecond), seen.Round(time.Millisecond),
		filled.Round(time.Millisecond), took, logInt(synced, "messages"), logInt(synced, "bytes"))
	// What the kernel has right after that sync (a later sync may be
	// under way already), and once the proxy has been quiet for 3s.
	// The first sync must already be complete: a restarting proxy must not
	// program a partial view (it once had 70 of 50,000 endpoints here).
	if got := countFake(a.nftRuleset(t)); got != scaleServices*scaleEndpoints {
		t.Errorf("right after the first full sync, nft list ruleset has %d of the %d fake endpoint addresses", got, scaleServices*scaleEndpoints)
	}
	before := countSyncs(p.log.lines())
	quietSince, n := time.Now(), before
	p.poll(t, 5*time.Minute, "the proxy to be quiet for 3s", func(context.Context) error {
		if c := countSyncs(p.log.lines()); c != n {
			quietSince, n = time.Now(), c
		}
		if d := time.Since(quietSince); d < 3*time.Second {
			return fmt.Errorf("last sync %v ago", d)
		}
		return nil
	})
	lines := p.log.lines()
	last := synced
	for _, l := range lines {
		if isSyncedLine(l) {
			last = l
		}
	}
	lastAt, _ := logTime(last)
	fake := countFake(a.nftRuleset(t))
	t.Logf("MEASURED %d more syncs after the full one before 3s of quiet; proxy start -> last of them done: %v; nft list ruleset then has %d of the %d fake endpoint addresses",
		countSyncs(lines)-before, lastAt.Sub(start).Round(time.Millisecond), fake, scaleServices*scaleEndpoints)
	if fake != scaleServices*scaleEndpoints {
		t.Errorf("once quiet, the ruleset has %d of the %d endpoint addresses", fake, scaleServices*scaleEndpoints)
	}

	// One more Service, with ten live endpoints.
	t0 = time.Now()
	var svc corev1.Service
	a.do(t, "POST", servicesPath, scaleService(scaleNewName), &svc)
	a.do(t, "POST", slicesPath, apiSlice(scaleNewName, nil, servers...), nil)
	names := make([]string, len(servers))
	for i, s := range servers {
		names[i] = s.Name
	}
	first, all := a.waitAllBackends(t, t0, time.Minute, hostPort(svc.Spec.ClusterIP, webPort), names)
	t.Logf("MEASURED with %d Services programmed, create 1 Service + %d endpoints -> first answer via ClusterIP %s: %v; -> all %d pods answered: %v",
		scaleServices, len(servers), svc.Spec.ClusterIP, first.Round(time.Millisecond), len(servers), all.Round(time.Millisecond))
	for _, l := range p.log.lines() {
		if isSyncedLine(l) {
			t.Logf("sync: %s", l)
		}
	}
	a.proxy.checkRunning(t)
}

// waitAllBackends polls addr from pod-c until every one of pods has
// answered (across polls) and the latest poll had no failure, and returns
// the time from since to the first answer and to then.
func (a *apiEnv) waitAllBackends(t *testing.T, since time.Time, timeout time.Duration, addr string, pods []string) (first, all time.Duration) {
	t.Helper()
	seen := map[string]bool{}
	a.proxy.poll(t, timeout, fmt.Sprintf("%s answered by each of %v", addr, pods), func(ctx context.Context) error {
		if first == 0 {
			if sum, _ := a.client(ctx, podC.Name, "tcp", addr, 1, "--timeout", "200ms"); sum != nil && sum.OK > 0 {
				first = time.Since(since)
				for b := range sum.Backend {
					seen[b] = true
				}
			}
		}
		sum, err := a.client(ctx, podC.Name, "tcp", addr, 40, "--timeout", "300ms", "--until-fail", "--results", "failed")
		if sum == nil {
			return err
		}
		for b := range sum.Backend {
			seen[b] = true
		}
		if sum.Failed > 0 {
			return fmt.Errorf("request %d of 40 failed: %s", sum.OK+sum.Failed, firstError(sum))
		}
		for _, p := range pods {
			if !seen[p] {
				return fmt.Errorf("%s has not answered yet (so far %v)", p, sortedKeys(seen))
			}
		}
		if len(seen) != len(pods) {
			return fmt.Errorf("answered by %v, want only %v", sortedKeys(seen), pods)
		}
		return nil
	})
	all = time.Since(since)
	if first == 0 {
		first = all
	}
	return first, all
}

// scaleService is a single-stack IPv4 ClusterIP Service name whose
// address the API server picks, with one TCP port "http", 80 to podTCPPort.
func scaleService(name string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeClusterIP,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy: ptr(corev1.IPFamilyPolicySingleStack),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podTCPPort),
			}},
		},
	}
}

// fakeEndpoints returns the scaleEndpoints addresses of Service i, in
// 10.245.0.0/16: outside the pod network, answered by nothing.
func fakeEndpoints(i int) []netip.Addr {
	out := make([]netip.Addr, scaleEndpoints)
	for j := range out {
		n := i*scaleEndpoints + j
		out[j] = netip.AddrFrom4([4]byte{10, 245, byte(n >> 8), byte(n)})
	}
	return out
}

// scaleSlice is apiSlice with ready endpoints at addrs rather than pods.
func scaleSlice(service string, addrs []netip.Addr) *discoveryv1.EndpointSlice {
	es := apiSlice(service, nil)
	for i, addr := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(nodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("%s-%d", service, i)},
		})
	}
	return es
}

// scaleClient returns a function like srv.Do over a client of its own
// whose connection pool fits scaleWorkers, so that the workers reuse their
// connections instead of handshaking anew.
func scaleClient(srv *apiserver.Server) func(ctx context.Context, method, path string, in, out any) error {
	tr := srv.HTTPClient().Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * scaleWorkers
	c := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	return func(ctx context.Context, method, path string, in, out any) error {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+srv.Token)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode/100 != 2 {
			return &apiserver.StatusError{Method: method, Path: path, Code: resp.StatusCode, Body: data}
		}
		if out != nil {
			return json.Unmarshal(data, out)
		}
		return nil
	}
}

// countFake returns how many distinct fakeEndpoints addresses ruleset has.
func countFake(ruleset string) int {
	seen := map[string]bool{}
	for _, a := range regexp.MustCompile(`\b10\.245\.\d+\.\d+\b`).FindAllString(ruleset, -1) {
		seen[a] = true
	}
	return len(seen)
}

// logField returns the value of key=value in a log line, unquoted, or "".
func logField(line, key string) string {
	m := regexp.MustCompile(`(?:^|\s)` + regexp.QuoteMeta(key) + `=("(?:[^"\\]|\\.)*"|\S*)`).FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	if s, err := strconv.Unquote(m[1]); err == nil {
		return s
	}
	return m[1]
}

// logInt is logField as an int, or -1.
func logInt(line, key string) int {
	n, err := strconv.Atoi(logField(line, key))
	if err != nil {
		return -1
	}
	return n
}
