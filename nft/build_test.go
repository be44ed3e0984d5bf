package nft

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// demoState is a small dual-stack state: a TCP NodePort service with two
// endpoints and a UDP ClusterIP service with one.
func demoState() *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	dns := model.ServicePortName{Namespace: "default", Name: "dns-like", Port: "dns"}
	st.Services = st.Services.With(web, &model.ServicePort{Name: web, Protocol: model.TCP, Port: 80, NodePort: 30080,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::10")}})
	st.Services = st.Services.With(dns, &model.ServicePort{Name: dns, Protocol: model.UDP, Port: 53,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}})
	ep := func(ip string, port uint16) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(ip), Port: port, NodeName: "node-1", Ready: true, Serving: true}
	}
	st.Endpoints = st.Endpoints.With(web, []model.Endpoint{ep("10.244.0.10", 8080), ep("10.244.0.11", 8080), ep("fd00:10:244::10", 8080)})
	st.Endpoints = st.Endpoints.With(dns, []model.Endpoint{ep("10.244.0.10", 5353)})
	return st
}

func demoConfig() Config {
	cfg := DefaultConfig()
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	cfg.ClusterIPChecks = true // the golden cases' nftables mode
	return cfg
}

func proxierName(ns, name, port string) model.ServicePortName {
	return model.ServicePortName{Namespace: ns, Name: name, Port: port}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// A NodePort that another Service holds in one IP family is programmed in
// the other family only.
func TestNodePortHeldInOneFamily(t *testing.T) {
	name := model.ServicePortName{Namespace: "default", Name: "newcomer", Port: "http"}
	svc := &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, NodePort: 30080, NodePortHeldV4: true,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11"), netip.MustParseAddr("fd00:10:96::11")}}
	eps := []model.Endpoint{
		{Addr: netip.MustParseAddr("10.244.0.10"), Port: 8080, Ready: true, Serving: true},
		{Addr: netip.MustParseAddr("fd00:10:244::10"), Port: 8080, Ready: true, Serving: true},
	}
	for _, tc := range []struct {
		f    nftlib.Family
		want bool
	}{{nftlib.IPv4, false}, {nftlib.IPv6, true}} {
		fr := BuildFragment(tc.f, demoConfig(), model.Node{Name: "node-1"}, svc, eps)
		got := slices.ContainsFunc(fr.Elements, func(e nftlib.MapElement) bool {
			return e.Map == mapServicePorts && e.Key.Port == 30080
		})
		if got != tc.want {
			t.Errorf("%s: NodePort element present %v, want %v", tc.f, got, tc.want)
		}
	}
}
