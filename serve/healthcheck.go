package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/kube-nftproxy/kube-nftproxy/internal/loglevel"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// HealthChecks serves the healthCheckNodePort of every externalTrafficPolicy
// Local Service, as kube-proxy does: 200 with the number of local endpoints
// when this node has some, 503 when it has none, so that load balancers send
// traffic only to nodes that can serve it. The number is also in the
// X-Load-Balancing-Endpoint-Weight header.
type HealthChecks struct {
	// Host is the address to listen on ("" for all of the node's).
	Host string
	// Addrs, when set, gives the addresses to listen on instead, from the
	// State being applied (kube-proxy serves health check node ports on
	// the --nodeport-addresses); none means all of the node's.
	Addrs func(*model.State) []netip.Addr
	Log   *slog.Logger
	// Healthy, when set, reports the proxy's own health (answered as
	// serviceProxyHealthy; a sick proxy answers 503 too).
	Healthy func() bool
	// Guard counts and caps the servers' connections, with those of the
	// proxy's other HTTP servers (nil: a guard of their own, with the
	// default limits).
	Guard *ConnGuard

	mu      sync.Mutex
	servers map[uint16]*hcServer
	// index follows the States given to Update (from one goroutine).
	index hcIndex
}

type hcServer struct {
	srv   *Server
	name  model.ServicePortName
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
//
// The count is kube-proxy's (EndpointsMap.LocalReadyEndpoints): the distinct
// addresses of the Service's ready endpoints on this node, over all its
// ports. Serving terminating endpoints are not counted, even when traffic
// still goes to them, so that a node whose pods are all terminating fails
// its health check and load balancers drain it. kube-proxy runs one proxier
// per IP family; the count is that of the family with the most, which for a
// dual-stack Service is the number of pods, not twice it.
func (h *HealthChecks) Update(st *model.State) {
	want := h.wanted(st)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.servers == nil {
		h.servers = map[uint16]*hcServer{}
	}
	for port, s := range h.servers {
		if w, ok := want[port]; !ok || w.name != s.name {
			h.log().Log(context.Background(), loglevel.V2, "closing a health check node port", "service", s.name.String(), "port", port)
			_ = s.srv.Close()
			delete(h.servers, port)
		}
	}
	for port, w := range want {
		h.serve(st, port, w)
	}
}

// hcWant is what a health check node port answers for.
type hcWant struct {
	name  model.ServicePortName // the Service's; Port is ""
	count int                   // its local ready endpoints
}

// wanted returns the health check node ports st asks for. They are
// assigned in name order, so that of two Services claiming one port
// (which the API server does not allow; state files might) the same one
// wins. The cost is the service ports changed since the last call, plus
// the Services that have a health check node port.
func (h *HealthChecks) wanted(st *model.State) map[uint16]hcWant {
	h.index.update(st)
	names := slices.SortedFunc(maps.Keys(h.index.services), func(a, b model.ServicePortName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	want := map[uint16]hcWant{}
	for _, name := range names {
		s := h.index.services[name]
		if other, ok := want[s.port]; ok {
			h.log().Error("cannot serve a health check node port: another Service has it", "service", name.String(), "port", s.port, "other", other.name.String())
			continue
		}
		want[s.port] = hcWant{name, s.count}
	}
	return want
}

// serve opens port for w, or sets the count of the server already there.
// Under h.mu.
func (h *HealthChecks) serve(st *model.State, port uint16, w hcWant) {
	if s, ok := h.servers[port]; ok {
		if s.count != w.count {
			h.log().Debug("health check node port: local endpoints", "service", w.name.String(), "port", port, "count", w.count)
		}
		s.count = w.count
		return
	}
	h.log().Log(context.Background(), loglevel.V2, "opening a health check node port", "service", w.name.String(), "port", port, "localEndpoints", w.count)
	s, err := h.open(port, h.hosts(st))
	if err != nil {
		h.log().Error("cannot serve a health check node port", "service", w.name.String(), "port", port, "err", err)
		return
	}
	s.name, s.count = w.name, w.count
	h.servers[port] = s
}

// guard returns h.Guard, made with the default limits if unset. Under h.mu.
func (h *HealthChecks) guard() *ConnGuard {
	if h.Guard == nil {
		h.Guard = NewConnGuard(DefaultLimits(), h.log())
	}
	return h.Guard
}

func (h *HealthChecks) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

// hosts lists the addresses a new server listens on.
func (h *HealthChecks) hosts(st *model.State) []string {
	if h.Addrs != nil {
		var out []string
		for _, a := range h.Addrs(st) {
			out = append(out, a.String())
		}
		if len(out) > 0 {
			return out
		}
	}
	return []string{h.Host}
}

func (h *HealthChecks) open(port uint16, hosts []string) (*hcServer, error) {
	var lns []net.Listener
	for _, host := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("listening on %s: %w", net.JoinHostPort(host, strconv.Itoa(int(port))), err)
		}
		lns = append(lns, ln)
	}
	s := &hcServer{}
	s.srv = h.guard().NewServer("healthcheck", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		var body hcBody
		body.Service.Namespace, body.Service.Name = s.name.Namespace, s.name.Name
		body.LocalEndpoints = s.count
		h.mu.Unlock()
		body.ServiceProxyHealthy = h.Healthy == nil || h.Healthy()
		// kube-proxy's headers and body, to the byte: the JSON indented
		// with tabs, no newline at the end. The weight header is the local
		// endpoint count on every answer (0 with a 503), for load
		// balancers that spread traffic over nodes by it.
		out, _ := json.MarshalIndent(body, "", "\t")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(body.LocalEndpoints))
		if body.LocalEndpoints == 0 || !body.ServiceProxyHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(out)
	}))
	for _, ln := range lns {
		go func() {
			if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log().Error("health check node port server stopped", "port", port, "err", err)
			}
		}()
	}
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
