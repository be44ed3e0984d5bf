package filesource

import (
	"maps"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// TestDemoExample pins examples/demo to the sandbox e2e/TOPOLOGY.md
// describes; the kernel e2e tests and `make demo` rely on this model.
func TestDemoExample(t *testing.T) {
	st, problems := LoadState("../../examples/demo", "node-1")
	if len(problems) > 0 || st == nil {
		t.Fatalf("loading the demo: %v", problems)
	}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	dns := model.ServicePortName{Namespace: "default", Name: "dns-like", Port: "dns"}

	want := model.NewState()
	want.Node = model.Node{
		Name:     "node-1",
		Zone:     "zone-a",
		PodCIDRs: sourcetest.Prefixes("10.244.0.0/24", "fd00:10:244::/64"),
		IPs:      sourcetest.Addrs("10.99.0.1", "fd00:99::1"),
	}
	want.Services = want.Services.With(web, &model.ServicePort{
		Name: web, Protocol: model.TCP, Port: 80, NodePort: 30080,
		ClusterIPs: sourcetest.Addrs("10.96.0.10", "fd00:10:96::10"),
	})
	want.Services = want.Services.With(dns, &model.ServicePort{
		Name: dns, Protocol: model.UDP, Port: 53, NodePort: 30053,
		ClusterIPs: sourcetest.Addrs("10.96.0.53"),
	})
	local := func(addr string, port uint16) model.Endpoint {
		e := sourcetest.ReadyEndpoint(addr, port)
		e.Zone = "zone-a"
		return e
	}
	want.Endpoints = want.Endpoints.With(web, []model.Endpoint{
		local("10.244.0.10", 8080), local("10.244.0.11", 8080),
		local("fd00:10:244::10", 8080), local("fd00:10:244::11", 8080),
	})
	want.Endpoints = want.Endpoints.With(dns, []model.Endpoint{local("10.244.0.10", 5353), local("10.244.0.11", 5353)})

	sourcetest.MustEqual(t, "node", st.Node, want.Node)
	sourcetest.MustEqual(t, "service names", st.SortedNames(), want.SortedNames())
	for _, n := range want.SortedNames() {
		sourcetest.MustEqual(t, n.String(), *st.Services.Get(n), *want.Services.Get(n))
	}
	sourcetest.MustEqualEntries(t, "endpoints", st.Endpoints, maps.Collect(want.Endpoints.All()))
}
