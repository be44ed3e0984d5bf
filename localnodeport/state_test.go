package localnodeport

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

func TestPorts(t *testing.T) {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	add := func(name string, svc model.ServicePort, eps ...model.Endpoint) {
		n := model.ServicePortName{Namespace: "default", Name: name, Port: "http"}
		svc.Name = n
		st.Services = st.Services.With(n, &svc)
		st.Endpoints = st.Endpoints.With(n, eps)
	}
	ip := netip.MustParseAddr
	ep := func(addr, node string, ready bool) model.Endpoint {
		return model.Endpoint{Addr: ip(addr), Port: 8080, NodeName: node, Ready: ready, Serving: ready}
	}
	dual := []netip.Addr{ip("10.96.0.1"), ip("fd00::1")}
	add("web", model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30080, ClusterIPs: dual},
		ep("10.244.0.1", "node-1", true), ep("10.244.1.1", "node-2", true), ep("10.244.1.2", "node-2", false), ep("fd00:10:244::1", "node-1", true))
	// externalTrafficPolicy Local: the node's own endpoints only (none).
	add("local", model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30081, ClusterIPs: dual[:1], ExternalPolicyLocal: true, AffinityTimeout: time.Hour},
		ep("10.244.1.1", "node-2", true))
	add("dns", model.ServicePort{Protocol: model.UDP, Port: 53, NodePort: 30053, ClusterIPs: dual}, ep("10.244.0.1", "node-1", true))
	add("clusterip", model.ServicePort{Protocol: model.TCP, Port: 80, ClusterIPs: dual}, ep("10.244.0.1", "node-1", true))
	add("held", model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30082, NodePortHeldV4: true, ClusterIPs: dual}, ep("fd00:10:244::1", "node-1", true))
	add("empty", model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30083, ClusterIPs: dual})

	show := func(ports []Port) string {
		var lines []string
		for _, p := range ports {
			lines = append(lines, p.Name+" "+netip.AddrPortFrom(netip.IPv4Unspecified(), p.NodePort).String()+" -> "+strings.Trim(strings.ReplaceAll(fmtEps(p.Endpoints), " ", ","), ",")+" affinity "+p.Affinity.String())
		}
		slices.Sort(lines)
		return strings.Join(lines, "\n")
	}
	for _, tc := range []struct {
		ipv6 bool
		want string
	}{
		{false, `default/empty:http 0.0.0.0:30083 ->  affinity 0s
default/local:http 0.0.0.0:30081 ->  affinity 1h0m0s
default/web:http 0.0.0.0:30080 -> 10.244.0.1:8080,10.244.1.1:8080 affinity 0s`},
		{true, `default/empty:http 0.0.0.0:30083 ->  affinity 0s
default/held:http 0.0.0.0:30082 -> [fd00:10:244::1]:8080 affinity 0s
default/web:http 0.0.0.0:30080 -> [fd00:10:244::1]:8080 affinity 0s`},
	} {
		if got := show(Ports(st, tc.ipv6)); got != tc.want {
			t.Errorf("ipv6 %v:\n%s\nwant\n%s", tc.ipv6, got, tc.want)
		}
	}
}

func fmtEps(eps []netip.AddrPort) string {
	var s []string
	for _, e := range eps {
		s = append(s, e.String())
	}
	return strings.Join(s, " ")
}
