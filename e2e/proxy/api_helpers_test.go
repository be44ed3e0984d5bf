package proxy

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// apiEnv is a sandbox whose node namespace runs etcd, kube-apiserver (on
// 127.0.0.1 of that namespace) and the proxy in API mode, with agent servers
// in pod-a and pod-b (and any extra pods) and pod-c as the client.
type apiEnv struct {
	*env
	srv *apiserver.Server
}

// newAPIEnv builds an apiEnv that the end of the test takes down, in the
// reverse order: proxy, API server and etcd, sandbox. It skips the test
// when the API server harness is unavailable (fails it when
// KNP_REQUIRE_APISERVER=1) before creating anything. Extra pods get agent
// servers too.
func newAPIEnv(t *testing.T, extra ...sandbox.Pod) *apiEnv {
	t.Helper()
	needRoot(t)
	if err := apiserver.Available(); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skipf("skipping API server test: %v", err)
	}
	servers := append([]sandbox.Pod{podA, podB}, extra...)
	e := &env{sb: newSandbox(t, append(slices.Clone(servers), podC))}
	for _, p := range servers {
		e.startServer(t, p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: e.sb.NS(sandbox.Node)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready at %s in %s after %v", srv.URL, e.sb.NS(sandbox.Node), time.Since(t0).Round(time.Millisecond))
	e.proxy = startAPIProxy(t, e.sb, srv.ProxyKubeconfig)
	return &apiEnv{env: e, srv: srv}
}

// startAPIProxy runs the proxy in the node namespace against the API server
// of kubeconfig and waits for its first sync after the caches filled. The
// end of the test stops it with SIGTERM, and it must exit 0.
func startAPIProxy(t *testing.T, sb *sandbox.Sandbox, kubeconfig string) *proxy {
	t.Helper()
	p := launchProxy(t, sb, 5*time.Second, proxyBin, "--proxy-mode=nftables",
		"--kubeconfig", kubeconfig,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms",
	)
	p.waitLog(t, 30*time.Second, "the proxy's first sync from the API server", func(lines []string) bool {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "API server caches filled") })
		return i >= 0 && countSyncs(lines[i:]) > 0
	})
	return p
}

// do sends a request to the API server with the admin token and fails the
// test if it does not succeed.
func (a *apiEnv) do(t *testing.T, method, path string, in, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := a.srv.Do(ctx, method, path, in, out); err != nil {
		t.Fatal(err)
	}
}

const (
	servicesPath = "/api/v1/namespaces/default/services"
	slicesPath   = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
)

// apiService is a single-stack IPv4 Service name with one TCP port "http",
// port 80 to target port podTCPPort, on clusterIP ("None": headless).
func apiService(name, clusterIP string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podTCPPort),
			}},
		},
	}
}

// apiSlice is the IPv4 EndpointSlice "<service>-ipv4" of service, with the
// given labels added to the service-name one (as the EndpointSlice
// controller copies the Service's), listing pods as ready endpoints on
// node-1, port "http" = podTCPPort.
func apiSlice(service string, labels map[string]string, pods ...sandbox.Pod) *discoveryv1.EndpointSlice {
	l := map[string]string{
		discoveryv1.LabelServiceName: service,
		discoveryv1.LabelManagedBy:   "kube-nftproxy-e2e",
	}
	for k, v := range labels {
		l[k] = v
	}
	es := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Name: service + "-ipv4", Namespace: "default", Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(podTCPPort)),
		}},
		Endpoints: []discoveryv1.Endpoint{},
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IPv4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(nodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: p.Name},
		})
	}
	return es
}

// setSliceEndpoints replaces the endpoints of slice name with pods (a PUT
// of what apiSlice builds, at the slice's current resourceVersion).
func (a *apiEnv) setSliceEndpoints(t *testing.T, service string, pods ...sandbox.Pod) {
	t.Helper()
	var cur discoveryv1.EndpointSlice
	a.do(t, "GET", slicesPath+"/"+service+"-ipv4", nil, &cur)
	es := apiSlice(service, nil, pods...)
	es.ResourceVersion = cur.ResourceVersion
	a.do(t, "PUT", slicesPath+"/"+service+"-ipv4", es, nil)
}

// startingEvents lists the events.k8s.io/v1 events of reason Starting
// on Node node (kube-proxy's, and ours, at start).
func (a *apiEnv) startingEvents(ctx context.Context, node string) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := a.srv.Do(ctx, "GET", "/apis/events.k8s.io/v1/namespaces/default/events", nil, &list); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Reason == "Starting" {
			out = append(out, e)
		}
	}
	return out, nil
}

// probe sends n TCP requests from pod-c to addr with short timeouts and
// returns nil when all were answered by exactly the pods named.
func (a *env) probe(ctx context.Context, addr string, n int, pods ...string) error {
	return a.probeFrom(ctx, podC.Name, addr, n, pods...)
}

// probeFrom is probe from namespace ns.
func (a *env) probeFrom(ctx context.Context, ns, addr string, n int, pods ...string) error {
	sum, err := a.client(ctx, ns, "tcp", addr, n, "--timeout", "300ms", "--until-fail", "--results", "failed")
	if sum == nil {
		return err
	}
	if sum.Failed > 0 {
		return fmt.Errorf("request %d of %d failed: %s", sum.OK+sum.Failed, n, firstError(sum))
	}
	if got, want := sortedKeys(sum.Backend), slices.Sorted(slices.Values(pods)); !slices.Equal(got, want) {
		return fmt.Errorf("answered by %v, want each of %v", got, want)
	}
	return nil
}

// waitTraffic polls probe until it succeeds, failing the test after
// timeout (or if the proxy exits), and returns the time from since to the
// first answer from any backend and to the first successful probe.
func (a *env) waitTraffic(t *testing.T, since time.Time, timeout time.Duration, addr string, pods ...string) (first, all time.Duration) {
	t.Helper()
	a.proxy.poll(t, timeout, fmt.Sprintf("%s answered by %v", addr, pods), func(ctx context.Context) error {
		if first == 0 {
			if sum, _ := a.client(ctx, podC.Name, "tcp", addr, 1, "--timeout", "200ms"); sum != nil && sum.OK > 0 {
				first = time.Since(since)
			}
		}
		return a.probe(ctx, addr, 16, pods...)
	})
	all = time.Since(since)
	if first == 0 {
		first = all
	}
	return first, all
}

// nftRuleset returns `nft list ruleset` of the node namespace.
func (e *env) nftRuleset(t *testing.T) string {
	t.Helper()
	out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func ptr[T any](v T) *T { return &v }
