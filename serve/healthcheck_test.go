package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// Health check node ports open and close with their Services and answer
// 200 with the local endpoint count, 503 without local endpoints.
func TestHealthChecks(t *testing.T) {
	port := freePort(t)
	name := model.ServicePortName{Namespace: "default", Name: "lb", Port: "http"}
	state := func(local bool, withService bool) *model.State {
		st := model.NewState()
		st.Node = model.Node{Name: "node-1"}
		if !withService {
			return st
		}
		st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, NodePort: 30080, HealthCheckNodePort: port,
			ExternalPolicyLocal: true, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")}})
		node := "node-2"
		if local {
			node = "node-1"
		}
		st.Endpoints = st.Endpoints.With(name, []model.Endpoint{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, NodeName: node, Ready: true, Serving: true}})
		return st
	}
	h := &HealthChecks{Host: "127.0.0.1"}
	defer h.Close(context.Background())
	get := func() (int, hcBody, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return 0, hcBody{}, err
		}
		defer resp.Body.Close()
		var b hcBody
		err = json.NewDecoder(resp.Body).Decode(&b)
		return resp.StatusCode, b, err
	}

	h.Update(state(true, true))
	code, body, err := get()
	if err != nil || code != 200 || body.LocalEndpoints != 1 || body.Service.Name != "lb" || !body.ServiceProxyHealthy {
		t.Fatalf("with a local endpoint: %d %+v %v, want 200 with localEndpoints 1", code, body, err)
	}
	h.Update(state(false, true))
	if code, body, err := get(); err != nil || code != 503 || body.LocalEndpoints != 0 {
		t.Errorf("without a local endpoint: %d %+v %v, want 503", code, body, err)
	}
	h.Update(state(false, false))
	if _, _, err := get(); err == nil {
		t.Errorf("the port still answers after its Service is gone")
	}
	if len(h.Ports()) != 0 {
		t.Errorf("ports still open: %v", h.Ports())
	}
}

// The count is kube-proxy's LocalReadyEndpoints: distinct addresses of the
// ready local endpoints over all the Service's ports, per family (a
// dual-stack pod is one endpoint), terminating ones left out; the body is
// kube-proxy's, byte for byte.
func TestHealthChecksCountAndBody(t *testing.T) {
	port := freePort(t)
	http1 := model.ServicePortName{Namespace: "ns", Name: "lb", Port: "http"}
	https := model.ServicePortName{Namespace: "ns", Name: "lb", Port: "https"}
	ep := func(addr, node string, ready bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, NodeName: node, Ready: ready, Serving: true, Terminating: !ready}
	}
	state := func(eps ...model.Endpoint) *model.State {
		st := model.NewState()
		st.Node = model.Node{Name: "node-1"}
		for _, n := range []model.ServicePortName{http1, https} {
			st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.TCP, Port: 80, NodePort: 30080, HealthCheckNodePort: port,
				ExternalPolicyLocal: true, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5"), netip.MustParseAddr("fd00::5")}})
			st.Endpoints = st.Endpoints.With(n, eps)
		}
		return st
	}
	h := &HealthChecks{Host: "127.0.0.1"}
	defer h.Close(context.Background())
	get := func() (int, http.Header, string) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header, string(b)
	}
	body := func(count int, healthy bool) string {
		return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %t\n}", count, healthy)
	}
	tests := []struct {
		name  string
		eps   []model.Endpoint
		code  int
		want  string
		count int // the weight header
	}{
		{"two dual-stack local pods, two ports, one remote", []model.Endpoint{
			ep("10.244.0.10", "node-1", true), ep("10.244.0.11", "node-1", true), ep("10.244.1.10", "node-2", true),
			ep("fd00:10:244::10", "node-1", true), ep("fd00:10:244::11", "node-1", true),
		}, 200, body(2, true), 2},
		{"IPv6 only", []model.Endpoint{ep("fd00:10:244::10", "node-1", true)}, 200, body(1, true), 1},
		{"local ones terminating", []model.Endpoint{ep("10.244.0.10", "node-1", false), ep("10.244.1.10", "node-2", true)}, 503, body(0, true), 0},
		{"none", nil, 503, body(0, true), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.Update(state(tt.eps...))
			code, hdr, got := get()
			if code != tt.code || got != tt.want {
				t.Errorf("got %d %q, want %d %q", code, got, tt.code, tt.want)
			}
			if hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("headers %v, want kube-proxy's Content-Type and X-Content-Type-Options", hdr)
			}
			if w := hdr.Values("X-Load-Balancing-Endpoint-Weight"); len(w) != 1 || w[0] != fmt.Sprint(tt.count) {
				t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %d (the local endpoint count)", w, tt.count)
			}
		})
	}

	// A sick proxy answers 503 even with local endpoints (and their
	// count as the weight, as kube-proxy).
	h.Healthy = func() bool { return false }
	h.Update(state(ep("10.244.0.10", "node-1", true)))
	if code, hdr, got := get(); code != 503 || got != body(1, false) || hdr.Get("X-Load-Balancing-Endpoint-Weight") != "1" {
		t.Errorf("unhealthy proxy: got %d %q weight %q, want 503 %q weight 1", code, got, hdr.Get("X-Load-Balancing-Endpoint-Weight"), body(1, false))
	}
	h.Healthy = nil

	// Two Services claiming one port: the first by name serves, always.
	st := state(ep("10.244.0.10", "node-1", true))
	other := model.ServicePortName{Namespace: "ns", Name: "zz", Port: "http"}
	st.Services = st.Services.With(other, &model.ServicePort{Name: other, Protocol: model.TCP, Port: 80, NodePort: 30081, HealthCheckNodePort: port, ExternalPolicyLocal: true})
	for range 5 {
		h.Update(st)
		if _, _, got := get(); got != body(1, true) {
			t.Fatalf("two Services on one port: got %q, want ns/lb's %q", got, body(1, true))
		}
	}
}

// With Addrs (--nodeport-addresses), a server listens on those addresses
// only, every one of them.
func TestHealthChecksAddrs(t *testing.T) {
	port := freePort(t)
	name := model.ServicePortName{Namespace: "default", Name: "lb"}
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, HealthCheckNodePort: port, ExternalPolicyLocal: true,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")}})
	st.Endpoints = st.Endpoints.With(name, []model.Endpoint{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, NodeName: "node-1", Ready: true, Serving: true}})
	h := &HealthChecks{Addrs: func(*model.State) []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.3")}
	}}
	defer h.Close(context.Background())
	h.Update(st)
	for addr, want := range map[string]bool{"127.0.0.1": true, "127.0.0.3": true, "127.0.0.2": false} {
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/", addr, port))
		if err == nil {
			resp.Body.Close()
		}
		if (err == nil) != want {
			t.Errorf("GET on %s: %v; want answered %v", addr, err, want)
		}
	}
}

// wanted gives each Local-policy Service with a health check node port
// its port and local ready endpoint count, without opening anything.
func TestHealthChecksWanted(t *testing.T) {
	ep := func(addr, node string, ready bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, NodeName: node, Ready: ready, Serving: true, Terminating: !ready}
	}
	svc := func(ns, name, port string, hc uint16, local bool) *model.ServicePort {
		return &model.ServicePort{Name: model.ServicePortName{Namespace: ns, Name: name, Port: port}, Protocol: model.TCP, Port: 80,
			HealthCheckNodePort: hc, ExternalPolicyLocal: local}
	}
	lb := model.ServicePortName{Namespace: "ns", Name: "lb"}
	tests := []struct {
		name string
		svcs []*model.ServicePort
		eps  []model.Endpoint // of every Service
		want map[uint16]hcWant
	}{
		{"dual-stack pods count once, over the Service's ports", []*model.ServicePort{svc("ns", "lb", "http", 31000, true), svc("ns", "lb", "https", 31000, true)},
			[]model.Endpoint{ep("10.244.0.1", "node-1", true), ep("10.244.0.2", "node-1", true), ep("fd00::1", "node-1", true)},
			map[uint16]hcWant{31000: {lb, 2}}},
		{"remote and terminating endpoints do not count", []*model.ServicePort{svc("ns", "lb", "http", 31000, true)},
			[]model.Endpoint{ep("10.244.1.1", "node-2", true), ep("10.244.0.1", "node-1", false)},
			map[uint16]hcWant{31000: {lb, 0}}},
		{"IPv6 only", []*model.ServicePort{svc("ns", "lb", "http", 31000, true)},
			[]model.Endpoint{ep("fd00::1", "node-1", true), ep("fd00::2", "node-1", true)},
			map[uint16]hcWant{31000: {lb, 2}}},
		{"Cluster policy or no port: none", []*model.ServicePort{svc("ns", "a", "", 31000, false), svc("ns", "b", "", 0, true)},
			[]model.Endpoint{ep("10.244.0.1", "node-1", true)}, map[uint16]hcWant{}},
		{"two Services on one port: the first by name", []*model.ServicePort{svc("zz", "a", "", 31000, true), svc("ns", "lb", "", 31000, true)},
			nil, map[uint16]hcWant{31000: {lb, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := model.NewState()
			st.Node = model.Node{Name: "node-1"}
			for _, s := range tt.svcs {
				st.Services = st.Services.With(s.Name, s)
				st.Endpoints = st.Endpoints.With(s.Name, tt.eps)
			}
			if got := (&HealthChecks{}).wanted(st); !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
