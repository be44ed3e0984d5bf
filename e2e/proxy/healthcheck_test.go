package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The healthCheckNodePort of a LoadBalancer Service with
// externalTrafficPolicy Local, over real HTTP from the off-cluster client,
// as a cloud load balancer probes it (issue 4). kube-proxy serves it on the
// node's addresses: 200 while the node has local ready endpoints, 503
// without, and nothing (connection refused) once the Service is gone or no
// longer Local.

const (
	hcNamespace = "hc"
	hcName      = "lb"
	hcStateFile = "healthcheck.yaml"
	hcPort      = 32000
	// hcDeadline bounds each wait for the proxy to follow a change of the
	// state (it resyncs within about a second).
	hcDeadline = 15 * time.Second
)

// hcRemote is an endpoint on another node: never counted, never probed.
var hcRemote = sandbox.NewPod("pod-remote", 20)

// hcService is the Service's YAML: dual-stack, type LoadBalancer, two ports
// (they share the health check port, and a pod behind both counts once).
func hcService(local bool) string {
	etp := "Cluster"
	if local {
		etp = "Local"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: %s
spec:
  type: LoadBalancer
  clusterIP: 10.96.70.1
  clusterIPs: [10.96.70.1, "fd00:10:96::7001"]
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  externalTrafficPolicy: %s
  healthCheckNodePort: %d
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: %d, nodePort: 30701}
  - {name: dns, protocol: UDP, port: 53, targetPort: %d, nodePort: 30702}
`, hcName, hcNamespace, etp, hcPort, podTCPPort, podUDPPort)
}

// hcEndpoint is a pod in the Service's EndpointSlices, on node.
type hcEndpoint struct {
	pod  sandbox.Pod
	node string
}

// hcSlices returns the Service's EndpointSlices, one per family.
func hcSlices(eps ...hcEndpoint) string {
	var docs []string
	for _, family := range []string{"IPv4", "IPv6"} {
		var b strings.Builder
		fmt.Fprintf(&b, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-%s
  namespace: %s
  labels:
    kubernetes.io/service-name: %s
addressType: %s
ports:
- {name: http, protocol: TCP, port: %d}
- {name: dns, protocol: UDP, port: %d}
endpoints:
`, hcName, strings.ToLower(family), hcNamespace, hcName, family, podTCPPort, podUDPPort)
		for _, ep := range eps {
			addr := ep.pod.IPv4
			if family == "IPv6" {
				addr = ep.pod.IPv6
			}
			fmt.Fprintf(&b, `- addresses: [%q]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: %s
  targetRef: {kind: Pod, namespace: %s, name: %s}
`, addr, ep.node, hcNamespace, ep.pod.Name)
		}
		docs = append(docs, b.String())
	}
	return documents(docs...)
}

// hcAnswer is one answer of the health check port.
type hcAnswer struct {
	code        int
	contentType string
	weight      []string // X-Load-Balancing-Endpoint-Weight
	body        struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      *int  `json:"localEndpoints"`
		ServiceProxyHealthy *bool `json:"serviceProxyHealthy"`
	}
	raw string
}

// hcGet GETs http://addr/ from inside namespace ns, as a load balancer's
// probe would. A refused connection is an error that wraps ECONNREFUSED.
func hcGet(ctx context.Context, sb *sandbox.Sandbox, ns, addr string) (*hcAnswer, error) {
	client := httpClientIn(sb.NS(ns))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	a := &hcAnswer{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), raw: string(raw),
		weight: resp.Header.Values("X-Load-Balancing-Endpoint-Weight")}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		return nil, fmt.Errorf("GET %s: %s, body %q: %w", addr, resp.Status, raw, err)
	}
	return a, nil
}

// hcExpect polls the health check port on each of the node's addresses
// facing the client until it answers code with localEndpoints count, and
// fails the test if that does not happen within hcDeadline.
func hcExpect(t *testing.T, e *env, what string, code, count int) {
	t.Helper()
	for _, node := range []string{sandbox.NodeIPv4.Addr().String(), sandbox.NodeIPv6.Addr().String()} {
		addr := hostPort(node, fmt.Sprint(hcPort))
		var last *hcAnswer
		e.proxy.poll(t, hcDeadline, fmt.Sprintf("%s: GET %s answering %d with localEndpoints %d", what, addr, code, count), func(ctx context.Context) error {
			a, err := hcGet(ctx, e.sb, sandbox.Client, addr)
			if err != nil {
				return err
			}
			last = a
			if a.code != code || a.body.LocalEndpoints == nil || *a.body.LocalEndpoints != count {
				return fmt.Errorf("answered %d %q", a.code, a.raw)
			}
			return nil
		})
		// Everything else a load balancer or a user reads, as kube-proxy
		// serves it.
		b := last.body
		if b.Service.Namespace != hcNamespace || b.Service.Name != hcName {
			t.Errorf("%s: GET %s: service %s/%s, want %s/%s (body %q)", what, addr, b.Service.Namespace, b.Service.Name, hcNamespace, hcName, last.raw)
		}
		if b.ServiceProxyHealthy == nil || !*b.ServiceProxyHealthy {
			t.Errorf("%s: GET %s: serviceProxyHealthy is not true (body %q)", what, addr, last.raw)
		}
		if last.contentType != "application/json" {
			t.Errorf("%s: GET %s: Content-Type %q, want application/json", what, addr, last.contentType)
		}
		// kube-proxy's weight for load balancers: the local endpoint
		// count, on 503s too.
		if len(last.weight) != 1 || last.weight[0] != fmt.Sprint(count) {
			t.Errorf("%s: GET %s: X-Load-Balancing-Endpoint-Weight %q, want %d", what, addr, last.weight, count)
		}
	}
}

// hcExpectClosed polls until the health check port refuses connections on
// each of the node's addresses facing the client.
func hcExpectClosed(t *testing.T, e *env, what string) {
	t.Helper()
	for _, node := range []string{sandbox.NodeIPv4.Addr().String(), sandbox.NodeIPv6.Addr().String()} {
		addr := hostPort(node, fmt.Sprint(hcPort))
		e.proxy.poll(t, hcDeadline, fmt.Sprintf("%s: %s refusing connections", what, addr), func(ctx context.Context) error {
			a, err := hcGet(ctx, e.sb, sandbox.Client, addr)
			switch {
			case errors.Is(err, syscall.ECONNREFUSED):
				return nil
			case err != nil:
				return err
			}
			return fmt.Errorf("answered %d %q", a.code, a.raw)
		})
	}
}

// TestHealthCheckNodePort follows one Service through the changes that
// open, flip and close its health check port.
func TestHealthCheckNodePort(t *testing.T) {
	t.Parallel()
	local := []hcEndpoint{{podA, nodeName}, {podB, nodeName}, {hcRemote, policyRemoteNode}}
	e := newEnv(t, envOptions{extra: map[string]string{hcStateFile: documents(hcService(true), hcSlices(local...))}})

	// Two local pods, each behind both ports and in both families: two
	// endpoints, as kube-proxy counts them (the remote one is not counted).
	hcExpect(t, e, "two local endpoints", http.StatusOK, 2)

	// Only the remote endpoint left: the load balancer must stop sending
	// traffic here.
	writeAtomic(t, e.state, hcStateFile, documents(hcService(true), hcSlices(local[2])))
	hcExpect(t, e, "only a remote endpoint", http.StatusServiceUnavailable, 0)

	// The local endpoints back, then externalTrafficPolicy Cluster: no
	// health check port at all (every node can serve).
	writeAtomic(t, e.state, hcStateFile, documents(hcService(true), hcSlices(local...)))
	hcExpect(t, e, "local endpoints back", http.StatusOK, 2)
	writeAtomic(t, e.state, hcStateFile, documents(hcService(false), hcSlices(local...)))
	hcExpectClosed(t, e, "externalTrafficPolicy Cluster")
	writeAtomic(t, e.state, hcStateFile, documents(hcService(true), hcSlices(local...)))
	hcExpect(t, e, "externalTrafficPolicy Local again", http.StatusOK, 2)

	// The Service gone: the port closes.
	if err := os.Remove(filepath.Join(e.state, hcStateFile)); err != nil {
		t.Fatal(err)
	}
	hcExpectClosed(t, e, "the Service deleted")
}
