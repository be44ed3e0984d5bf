package proxier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// HealthChecks serves the healthCheckNodePort of every externalTrafficPolicy
// Local Service, as kube-proxy does: 200 with the number of local endpoints
// when this node has some, 503 when it has none, so that load balancers send
// traffic only to nodes that can serve it.
type HealthChecks struct {
	// Host is the address to listen on ("" for all of the node's).
	Host string
	Log  *slog.Logger
	// Healthy, when set, reports the proxy's own health (answered as
	// serviceProxyHealthy; a sick proxy answers 503 too).
	Healthy func() bool

	mu      sync.Mutex
	servers map[uint16]*hcServer
}

type hcServer struct {
	srv   *http.Server
	name  ServicePortName
	count int
}

type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// Update opens the ports of new Services, closes those of Services gone, and
// sets each one's local endpoint count from st.
func (h *HealthChecks) Update(st *State) {
	want := map[uint16]struct {
		name  ServicePortName
		count int
	}{}
	for name, svc := range st.Services {
		if svc.HealthCheckNodePort == 0 || !svc.ExternalPolicyLocal {
			continue
		}
		_, local, _, _ := CategorizeEndpoints(svc, st.Endpoints[name], st.Node)
		// One port per Service: its ports share it; count them all.
		w := want[svc.HealthCheckNodePort]
		w.name = ServicePortName{Namespace: name.Namespace, Name: name.Name}
		w.count += len(local)
		want[svc.HealthCheckNodePort] = w
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.servers == nil {
		h.servers = map[uint16]*hcServer{}
	}
	for port, s := range h.servers {
		if _, ok := want[port]; !ok {
			_ = s.srv.Close()
			delete(h.servers, port)
		}
	}
	for port, w := range want {
		if s, ok := h.servers[port]; ok {
			s.name, s.count = w.name, w.count
			continue
		}
		s, err := h.open(port)
		if err != nil {
			h.log().Error("cannot serve a health check node port", "service", w.name.String(), "port", port, "err", err)
			continue
		}
		s.name, s.count = w.name, w.count
		h.servers[port] = s
	}
}

func (h *HealthChecks) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

func (h *HealthChecks) open(port uint16) (*hcServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(h.Host, strconv.Itoa(int(port))))
	if err != nil {
		return nil, fmt.Errorf("listening on %d: %w", port, err)
	}
	s := &hcServer{}
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		var body hcBody
		body.Service.Namespace, body.Service.Name = s.name.Namespace, s.name.Name
		body.LocalEndpoints = s.count
		h.mu.Unlock()
		body.ServiceProxyHealthy = h.Healthy == nil || h.Healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if body.LocalEndpoints == 0 || !body.ServiceProxyHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log().Error("health check node port server stopped", "port", port, "err", err)
		}
	}()
	return s, nil
}

// Close stops every server (when the proxy stops).
func (h *HealthChecks) Close(context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		_ = s.srv.Close()
		delete(h.servers, port)
	}
}

// Ports lists the open ports (for tests and logs).
func (h *HealthChecks) Ports() []uint16 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []uint16
	for p := range h.servers {
		out = append(out, p)
	}
	return out
}
