package proxy

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"

	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// Names and addresses of the API tests' Services.
const (
	apiWebName    = "api-web"
	apiWebIP      = "10.96.1.10"
	apiOtherName  = "api-other" // service-proxy-name: other
	apiOtherIP    = "10.96.1.20"
	apiHeadless   = "api-headless"
	apiCanaryName = "api-canary"
	apiCanaryIP   = "10.96.1.30"
	// trafficDistribution PreferSameNode, its slice with hints.forNodes.
	apiSameNodeName = "api-samenode"
	apiSameNodeIP   = "10.96.1.40"
	// A port name longer than a container port's 15 characters.
	apiLongPortName = "api-longport"
	apiLongPortIP   = "10.96.1.50"
	apiLongPort     = "a-service-port-name-is-a-dns-label-of-up-to-63-chars"
)

// TestAPI runs the proxy against a real kube-apiserver in the sandbox's
// node namespace: it records kube-proxy's Starting event on its Node;
// Services and EndpointSlices created and changed through the API reach
// the kernel quickly, the rules survive the API server's death, the proxy
// reconnects when it returns, and Services that are not kube-proxy's are
// left alone. The steps build on each other, so the first failure ends
// the test.
func TestAPI(t *testing.T) {
	t.Parallel()
	a := newAPIEnv(t)
	web := hostPort(apiWebIP, webPort)

	steps := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"StartingEventOnNode", func(t *testing.T) { a.checkStartingEvent(t) }},
		{"CreateReachesBothPods", func(t *testing.T) {
			t0 := time.Now()
			a.do(t, "POST", servicesPath, apiService(apiWebName, apiWebIP, nil), nil)
			a.do(t, "POST", slicesPath, apiSlice(apiWebName, nil, podA, podB), nil)
			first, all := a.waitTraffic(t, t0, 2*time.Second, web, podA.Name, podB.Name)
			t.Logf("MEASURED create -> first answer via ClusterIP: %v; -> both pods answering: %v",
				first.Round(time.Millisecond), all.Round(time.Millisecond))
		}},
		{"UpdateFollows", func(t *testing.T) {
			t0 := time.Now()
			a.setSliceEndpoints(t, apiWebName, podB)
			_, all := a.waitTraffic(t, t0, 2*time.Second, web, podB.Name)
			t.Logf("MEASURED update -> pod-b only: %v", all.Round(time.Millisecond))
		}},
		{"IgnoredServicesNotProgrammed", func(t *testing.T) {
			other := map[string]string{kube.LabelServiceProxyName: "other"}
			a.do(t, "POST", servicesPath, apiService(apiOtherName, apiOtherIP, other), nil)
			a.do(t, "POST", slicesPath, apiSlice(apiOtherName, other, podA), nil)
			a.do(t, "POST", servicesPath, apiService(apiHeadless, "None", nil), nil)
			a.do(t, "POST", slicesPath, apiSlice(apiHeadless, map[string]string{kube.LabelHeadless: ""}, podA), nil)
			// A Service of ours created after them: once it is programmed,
			// the proxy has seen the ignored ones too (one watch stream,
			// in order).
			a.do(t, "POST", servicesPath, apiService(apiCanaryName, apiCanaryIP, nil), nil)
			a.do(t, "POST", slicesPath, apiSlice(apiCanaryName, nil, podA), nil)
			a.waitTraffic(t, time.Now(), 5*time.Second, hostPort(apiCanaryIP, webPort), podA.Name)
			rs := a.nftRuleset(t)
			// The checks below must be able to fail: what they look for
			// does appear for Services that are programmed.
			for _, s := range []string{apiWebIP, apiCanaryIP, svcChain("default/"+apiWebName+":http", "tcp"), svcChain("default/"+apiCanaryName+":http", "tcp")} {
				if !strings.Contains(rs, s) {
					t.Fatalf("nft list ruleset lacks %s of a programmed Service; the absence checks would prove nothing:\n%s", s, rs)
				}
			}
			for _, s := range []string{apiOtherIP, svcChain("default/"+apiOtherName+":http", "tcp"), svcChain("default/"+apiHeadless+":http", "tcp"), apiOtherName, apiHeadless} {
				if strings.Contains(rs, s) {
					t.Errorf("nft list ruleset contains %q of a Service that is not ours", s)
				}
			}
			if t.Failed() {
				t.Logf("nft list ruleset:\n%s", rs)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if sum, _ := a.client(ctx, podC.Name, "tcp", hostPort(apiOtherIP, webPort), 1, "--timeout", "300ms"); sum != nil && sum.OK > 0 {
				t.Errorf("the service-proxy-name: other Service's ClusterIP answered (by %v)", sortedKeys(sum.Backend))
			}
		}},
		{"NodeHintsPreferSameNode", func(t *testing.T) {
			// As upstream: with node hints on every Ready endpoint and one
			// for this node, this node's traffic goes to that one only, and
			// no KUBE-SEP chain is programmed for the other.
			svc := apiService(apiSameNodeName, apiSameNodeIP, nil)
			svc.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferSameNode)
			es := apiSlice(apiSameNodeName, nil, podA, podB)
			es.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: nodeName}}}
			es.Endpoints[1].NodeName = ptr(policyRemoteNode)
			es.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: policyRemoteNode}}}
			t0 := time.Now()
			a.do(t, "POST", servicesPath, svc, nil)
			a.do(t, "POST", slicesPath, es, nil)
			var stored discoveryv1.EndpointSlice
			a.do(t, "GET", slicesPath+"/"+es.Name, nil, &stored)
			if h := stored.Endpoints[1].Hints; h == nil || len(h.ForNodes) != 1 {
				t.Fatalf("the API server did not keep hints.forNodes (%+v); this test would prove nothing", h)
			}
			addr := hostPort(apiSameNodeIP, webPort)
			_, all := a.waitTraffic(t, t0, 5*time.Second, addr, podA.Name)
			t.Logf("MEASURED create with node hints -> pod-a only: %v", all.Round(time.Millisecond))
			spn := "default/" + apiSameNodeName + ":http"
			rs := a.nftRuleset(t)
			if sep := sepChain(spn, "tcp", netip.AddrPortFrom(podA.IPv4, podTCPPort)); !strings.Contains(rs, sep) {
				t.Errorf("nft list ruleset lacks pod-a's %s", sep)
			}
			if sep := sepChain(spn, "tcp", netip.AddrPortFrom(podB.IPv4, podTCPPort)); strings.Contains(rs, sep) {
				t.Errorf("nft list ruleset has %s for pod-b, hinted for another node:\n%s", sep, rs)
			}
			// pod-b's node hint gone: the node hints are incomplete (and
			// there are no zone hints), so every Ready endpoint serves.
			stored.Endpoints[1].Hints = nil
			t0 = time.Now()
			a.do(t, "PUT", slicesPath+"/"+es.Name, &stored, nil)
			_, all = a.waitTraffic(t, t0, 5*time.Second, addr, podA.Name, podB.Name)
			t.Logf("MEASURED a node hint removed -> both pods: %v", all.Round(time.Millisecond))
		}},
		{"LongPortNameProgrammed", func(t *testing.T) {
			// The API server checks a Service port's name as a DNS-1123
			// label, so names of 16-63 characters are valid and must be
			// programmed.
			svc := apiService(apiLongPortName, apiLongPortIP, nil)
			svc.Spec.Ports[0].Name = apiLongPort
			es := apiSlice(apiLongPortName, nil, podA)
			es.Ports[0].Name = ptr(apiLongPort)
			t0 := time.Now()
			a.do(t, "POST", servicesPath, svc, nil)
			a.do(t, "POST", slicesPath, es, nil)
			_, all := a.waitTraffic(t, t0, 5*time.Second, hostPort(apiLongPortIP, webPort), podA.Name)
			t.Logf("MEASURED create with a %d-character port name -> answered: %v", len(apiLongPort), all.Round(time.Millisecond))
			spn := "default/" + apiLongPortName + ":" + apiLongPort
			if rs := a.nftRuleset(t); !strings.Contains(rs, spn) {
				t.Errorf("nft list ruleset has no comment naming %s", spn)
			}
		}},
		{"SurvivesAPIServerKill", func(t *testing.T) {
			if err := a.srv.KillAPIServer(); err != nil {
				t.Fatal(err)
			}
			if a.srv.APIServerRunning() {
				t.Fatal("kube-apiserver still running after KillAPIServer")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			sum, err := a.client(ctx, podC.Name, "tcp", web, 20, "--interval", "150ms", "--timeout", "1s", "--results", "failed")
			if sum == nil {
				t.Fatal(err)
			}
			if sum.Failed > 0 || sum.OK != 20 {
				t.Errorf("with the API server dead: %d of 20 requests answered, %d failed: %s", sum.OK, sum.Failed, firstError(sum))
			}
			expectBackends(t, "with the API server dead", sum, podB.Name)
			a.proxy.checkRunning(t)
		}},
		{"ReconnectsAfterRestart", func(t *testing.T) {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if err := a.srv.StartAPIServer(ctx); err != nil {
				t.Fatal(err)
			}
			ready := time.Now()
			t.Logf("kube-apiserver ready again after %v", ready.Sub(t0).Round(time.Millisecond))
			a.setSliceEndpoints(t, apiWebName, podA, podB)
			_, all := a.waitTraffic(t, ready, 30*time.Second, web, podA.Name, podB.Name)
			t.Logf("MEASURED reconnect: API server ready -> change applied: %v; StartAPIServer called -> applied: %v",
				all.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
			a.proxy.checkRunning(t)
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.fn) {
			t.Fatalf("step %s failed; later steps depend on it", s.name)
		}
	}
}

// checkStartingEvent waits for the event kube-proxy records on its Node at
// start, written by our binary with kube-proxy's fields, once.
func (a *apiEnv) checkStartingEvent(t *testing.T) {
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var got []eventsv1.Event
	a.proxy.poll(t, 10*time.Second, "the Starting event on Node "+nodeName, func(ctx context.Context) error {
		if got, err = a.startingEvents(ctx, nodeName); err != nil {
			return err
		}
		if len(got) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	if len(got) != 1 {
		t.Fatalf("%d Starting events on Node %s, want 1: %+v", len(got), nodeName, got)
	}
	e := got[0]
	want := corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName}
	if e.Regarding != want {
		t.Errorf("regarding %+v, want %+v (kube-proxy's: no UID, no namespace)", e.Regarding, want)
	}
	for _, f := range []struct{ name, got, want string }{
		{"namespace", e.Namespace, "default"},
		{"type", e.Type, corev1.EventTypeNormal},
		{"action", e.Action, "StartKubeProxy"},
		{"reportingController", e.ReportingController, "kube-proxy"},
		{"reportingInstance", e.ReportingInstance, "kube-proxy-" + hostname},
		{"note", e.Note, ""},
	} {
		if f.got != f.want {
			t.Errorf("%s %q, want %q", f.name, f.got, f.want)
		}
	}
	// Written by our binary (its user agent names the field manager).
	if len(e.ManagedFields) == 0 || e.ManagedFields[0].Manager != "kube-nftproxy" {
		t.Errorf("managedFields %+v: want the event written by kube-nftproxy", e.ManagedFields)
	}
}
