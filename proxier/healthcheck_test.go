package proxier

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
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
	name := ServicePortName{Namespace: "default", Name: "lb", Port: "http"}
	state := func(local bool, withService bool) *State {
		st := NewState()
		st.Node = Node{Name: "node-1"}
		if !withService {
			return st
		}
		st.Services[name] = &ServicePort{Name: name, Protocol: TCP, Port: 80, NodePort: 30080, HealthCheckNodePort: port,
			ExternalPolicyLocal: true, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")}}
		node := "node-2"
		if local {
			node = "node-1"
		}
		st.Endpoints[name] = []Endpoint{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, NodeName: node, Ready: true, Serving: true}}
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
