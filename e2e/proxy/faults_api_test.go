package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// The API fault test's UDP Service, next to api-web.
const (
	apiDNSName = "api-dns"
	apiDNSIP   = "10.96.1.53"
)

// apiUDPService is apiService with one UDP port "dns", 53 to podUDPPort.
func apiUDPService(name, clusterIP string) *corev1.Service {
	s := apiService(name, clusterIP, nil)
	s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(podUDPPort)}}
	return s
}

// apiUDPSlice is apiSlice with the UDP port "dns" = podUDPPort.
func apiUDPSlice(service string, pods ...sandbox.Pod) *discoveryv1.EndpointSlice {
	es := apiSlice(service, nil, pods...)
	es.Ports = []discoveryv1.EndpointPort{{Name: ptr("dns"), Protocol: ptr(corev1.ProtocolUDP), Port: ptr(int32(podUDPPort))}}
	return es
}

// apiFaultSyncPeriod is the restarted proxy's --iptables-sync-period.
const apiFaultSyncPeriod = 5 * time.Second

// TestFaultAPIServerDownRestart programs Services from a real API server,
// stops the proxy, kills the API server and starts the proxy again against
// the dead server: the rules must stay exactly as they were for over two
// sync periods and traffic must not notice, while /readyz turns unhealthy
// (503) once a sync is overdue; when the API server comes back, the proxy
// must follow a change made through it, and be healthy again.
func TestFaultAPIServerDownRestart(t *testing.T) {
	t.Parallel()
	a := newAPIEnv(t)
	web, dns := hostPort(apiWebIP, webPort), hostPort(apiDNSIP, "53")
	a.do(t, "POST", servicesPath, apiService(apiWebName, apiWebIP, nil), nil)
	a.do(t, "POST", slicesPath, apiSlice(apiWebName, nil, podA, podB), nil)
	a.do(t, "POST", servicesPath, apiUDPService(apiDNSName, apiDNSIP), nil)
	a.do(t, "POST", slicesPath, apiUDPSlice(apiDNSName, podA, podB), nil)
	a.waitTraffic(t, time.Now(), 10*time.Second, web, podA.Name, podB.Name)
	a.proxy.poll(t, 10*time.Second, "the UDP Service to answer", func(ctx context.Context) error {
		_, err := a.client(ctx, podC.Name, "udp", dns, 4, "--timeout", "300ms")
		return err
	})

	f := a.startFlows(t, web, dns)
	a.proxy.stop(t)
	if err := a.srv.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	before := a.nftRuleset(t)
	dnats := strings.Count(before, "dnat to")

	t0 := time.Now()
	a.proxy = launchProxy(t, a.sb, 10*time.Second, proxyBin, "--proxy-mode=nftables",
		"--kubeconfig", a.srv.ProxyKubeconfig, "--master", a.srv.URL,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms",
		"--iptables-sync-period", apiFaultSyncPeriod.String(),
	)
	// The Starting event cannot be written while the API server is down
	// (client-go's broadcaster logs that as an error, as kube-proxy's);
	// its retry can reach the restarted API server before its authorizer
	// has loaded the RBAC objects, which refuses it as forbidden, once.
	a.proxy.expectedErrors = append(a.proxy.expectedErrors, "Unable to write event",
		`Server rejected event (will not retry!)" err="events.events.k8s.io is forbidden`)
	// Two sync periods and a bit: the rules must not change at all; and
	// /readyz must say 503 by then (kube-proxy: unhealthy once a sync is
	// overdue by twice the sync period).
	hold := 2*apiFaultSyncPeriod + 2*time.Second
	var unhealthy time.Duration
	var lastHealth string
	samples, changed := 0, false
	a.proxy.poll(t, hold+10*time.Second, fmt.Sprintf("%v with the API server down", hold), func(ctx context.Context) error {
		now, err := a.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		samples++
		if d := testutil.ListingDiff(testutil.SortedListing(string(now)), testutil.SortedListing(before), "the kernel now", "the kernel before the restart"); d != "" && !changed {
			changed = true
			t.Errorf("%v after the proxy started against the dead API server, its rules changed (dnat rules %d, were %d): %s",
				time.Since(t0).Round(time.Millisecond), strings.Count(string(now), "dnat to"), dnats, d)
		}
		code, body, err := a.health(ctx, "/readyz")
		lastHealth = fmt.Sprintf("%d %q %v", code, body, err)
		if code == 503 && unhealthy == 0 {
			unhealthy = time.Since(t0)
		}
		if time.Since(t0) < hold {
			return fmt.Errorf("holding")
		}
		return nil
	})
	if !changed {
		t.Logf("with the API server down: %d samples of nft list ruleset over %v, unchanged (%d dnat rules)", samples, hold, dnats)
	}
	if unhealthy == 0 {
		t.Errorf("/readyz never answered 503 in the %v after the proxy started against a dead API server (last: %s): it runs without rules of its own and says it is healthy", hold, lastHealth)
	} else {
		t.Logf("/readyz turned 503 %v after the proxy started", unhealthy.Round(time.Millisecond))
	}

	// The API server comes back; a change made through it reaches the
	// kernel.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := a.srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	a.setSliceEndpoints(t, apiWebName, podB)
	_, converged := a.waitTraffic(t, back, time.Minute, web, podB.Name)
	a.proxy.poll(t, 2*apiFaultSyncPeriod, "/readyz to answer 200 again", func(ctx context.Context) error {
		code, body, err := a.health(ctx, "/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("%d %q %v", code, body, err)
		}
		return nil
	})
	res := f.stop(t)
	t.Logf("API server back: a change made through it reached the kernel %v after it was ready", converged.Round(time.Millisecond))
	logFault(t, "proxy restarted while the API server is down, then the API server back", converged, res)
	// Three timed-out connections are forgiven: with etcd and kube-apiserver
	// busy in the node namespace of this shared 2-core machine, one SYN in
	// about 10,000 missed the 1s timeout (3 of 11 runs), two once while a
	// QEMU benchmark held the other core, at moments when the proxy did
	// nothing and the sampled ruleset was unchanged. A proxy that drops or
	// rewrites the rules fails many (40 in a minute).
	res.expectFailuresAtMost(t, "API server down across a proxy restart", 3)
	a.proxy.checkRunning(t)
}
