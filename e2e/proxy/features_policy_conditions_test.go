package proxy

import (
	"net/netip"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Endpoint conditions with real traffic (issue 3, item 8), as upstream's
// CategorizeEndpoints: Ready endpoints serve; when a Service has none, its
// serving and terminating ones do (so that connections draining through a
// rolling update are not cut); endpoints that are not serving never do.

// The conditions of EndpointSlice endpoints, by what kubelet reports.
func policyServingTerminating(p sandbox.Pod) policyEndpoint {
	return policyEndpoint{pod: p, serving: true, terminating: true}
}

func policyNotServingTerminating(p sandbox.Pod) policyEndpoint {
	return policyEndpoint{pod: p, terminating: true}
}

func policyNotReady(p sandbox.Pod) policyEndpoint { return policyEndpoint{pod: p} }

// TestPolicyEndpointConditions: every endpoint is on this node, and each pod
// would answer if traffic reached it.
func TestPolicyEndpointConditions(t *testing.T) {
	t.Parallel()
	svc := func(name, v4, v6 string) policyService {
		return policyService{
			name:        name,
			clusterIPv4: netip.MustParseAddr(v4), clusterIPv6: netip.MustParseAddr(v6),
			ports: []policyPort{policyHTTP, policyDNS},
		}
	}
	// One Ready endpoint among serving-terminating and not serving ones.
	ready := svc("cond-ready", "10.96.80.1", "fd00:10:96::8001")
	readySlices := func(eps ...policyEndpoint) string { return policySlices(ready, eps...) }
	// Nothing Ready: the serving terminating ones, not the others.
	terminating := svc("cond-terminating", "10.96.80.2", "fd00:10:96::8002")
	// Nothing Ready or serving: the Service has no endpoints (reject).
	none := svc("cond-none", "10.96.80.3", "fd00:10:96::8003")

	e := newPolicyEnv(t, documents(
		ready.yaml(), readySlices(policyReady(podA, ""), policyServingTerminating(podB), policyNotServingTerminating(policyPodD)),
		terminating.yaml(), policySlices(terminating, policyServingTerminating(podA), policyServingTerminating(podB), policyNotServingTerminating(policyPodD)),
		none.yaml(), policySlices(none, policyNotServingTerminating(podA), policyNotReady(podB), policyNotServingTerminating(policyPodD)),
	), nil)

	for _, f := range policyFamilies {
		t.Run(f.name, func(t *testing.T) {
			for _, p := range ready.ports {
				t.Run("ReadyOnly/"+p.proto(), func(t *testing.T) {
					policyExpect(t, e, podC.Name, p.proto(), policyAddr(f.clusterIP(ready), p.port), nil, podA)
				})
				t.Run("ServingTerminatingWhenNoneReady/"+p.proto(), func(t *testing.T) {
					policyExpect(t, e, podC.Name, p.proto(), policyAddr(f.clusterIP(terminating), p.port), nil, podA, podB)
				})
				// Neither pod-a nor pod-b answers: the ClusterIP is
				// rejected (ICMP port unreachable), as a Service
				// without endpoints.
				t.Run("NeverNotServing/"+p.proto(), func(t *testing.T) {
					policyExpectNoAnswer(t, e, "refused", podC.Name, p.proto(), policyAddr(f.clusterIP(none), p.port))
				})
			}
		})
	}

	// A rolling update of cond-ready, step by step: the state file is
	// rewritten and traffic follows within the proxy's resync. Every step
	// keeps an endpoint that answers, so no request may fail on the way.
	t.Run("RollingUpdate", func(t *testing.T) {
		addr := policyAddr(ready.clusterIPv4, policyHTTP.port)
		steps := []struct {
			what  string
			slice string
			want  []sandbox.Pod
		}{
			{"pod-d ready, pod-a terminating", readySlices(policyServingTerminating(podA), policyServingTerminating(podB), policyReady(policyPodD, "")), []sandbox.Pod{policyPodD}},
			{"pod-d terminating too: nothing ready", readySlices(policyServingTerminating(podA), policyNotServingTerminating(podB), policyServingTerminating(policyPodD)), []sandbox.Pod{podA, policyPodD}},
			{"pod-a stops serving", readySlices(policyNotServingTerminating(podA), policyNotServingTerminating(podB), policyServingTerminating(policyPodD)), []sandbox.Pod{policyPodD}},
			{"pod-b ready again", readySlices(policyNotServingTerminating(podA), policyReady(podB, ""), policyServingTerminating(policyPodD)), []sandbox.Pod{podB}},
		}
		others := documents(
			ready.yaml(),
			terminating.yaml(), policySlices(terminating, policyServingTerminating(podA), policyServingTerminating(podB), policyNotServingTerminating(policyPodD)),
			none.yaml(), policySlices(none, policyNotServingTerminating(podA), policyNotReady(podB), policyNotServingTerminating(policyPodD)),
		)
		for _, s := range steps {
			writeAtomic(t, e.state, policyStateFile, documents(others, s.slice))
			policyConverge(t, e, s.what, podC.Name, "tcp", addr, s.want...)
		}
	})
}
