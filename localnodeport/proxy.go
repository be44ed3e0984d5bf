// Package localnodeport answers TCP NodePorts on the loopback addresses in
// userspace, as kube-proxy's nftables mode does behind its alpha gate
// KubeProxyNFTablesLocalhostNodePorts (KEP-6032): a listener on
// 127.0.0.1:NodePort (or [::1]:NodePort) per Service port with endpoints,
// each accepted connection copied to one endpoint. The kernel cannot DNAT
// loopback traffic off the node without route_localnet, which opens the
// node's loopback services to its neighbours; a socket needs no such key.
// UDP and SCTP are not served, as upstream.
package localnodeport

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Port is one Service port's NodePort as the proxy serves it.
type Port struct {
	Name      string // namespace/name:port, for the logs
	NodePort  uint16
	Endpoints []netip.AddrPort
	// Affinity is sessionAffinity ClientIP's timeout; 0: none.
	Affinity time.Duration
}

// dialTimeout bounds the connection to an endpoint: a client of a dead
// endpoint is closed rather than left waiting.
const dialTimeout = 5 * time.Second

// Proxy serves the NodePorts of one IP family on that family's loopback
// address. Its methods may be called from any goroutine.
type Proxy struct {
	addr netip.Addr
	log  *slog.Logger
	obs  Observer
	now  func() time.Time

	ctx    context.Context // ends with Close: every connection goes
	cancel context.CancelFunc
	mu     sync.Mutex
	active map[uint16]*listener
	wg     sync.WaitGroup
}

// Observer is told what a Proxy does: the number of listeners after each
// Sync, and each listener that could not be opened. Either may be nil.
type Observer struct {
	Listeners    func(n int)
	ListenFailed func()
}

// New returns a Proxy listening on addr (127.0.0.1 or ::1).
func New(addr netip.Addr, log *slog.Logger, obs Observer) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	if obs.Listeners == nil {
		obs.Listeners = func(int) {}
	}
	if obs.ListenFailed == nil {
		obs.ListenFailed = func() {}
	}
	return &Proxy{addr: addr, log: log, obs: obs, now: time.Now, ctx: ctx, cancel: cancel, active: map[uint16]*listener{}}
}

// Sync makes the listeners those of ports with endpoints: a new NodePort
// is listened on, one that lost its endpoints or its Service is closed
// (its connections already open go on), and the others take the new
// endpoints for their next connections. A port another process holds is
// logged and tried again at the next Sync.
func (p *Proxy) Sync(ports []Port) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := map[uint16]Port{}
	for _, port := range ports {
		if len(port.Endpoints) > 0 && port.NodePort != 0 {
			want[port.NodePort] = port
		}
	}
	for np, l := range p.active {
		if _, ok := want[np]; !ok {
			l.close()
			delete(p.active, np)
		}
	}
	for np, port := range want {
		if l, ok := p.active[np]; ok {
			l.update(port)
			continue
		}
		l, err := p.listen(port)
		if err != nil {
			p.log.Error("Failed to listen on a localhost NodePort; trying again at the next sync", "servicePort", port.Name, "address", netip.AddrPortFrom(p.addr, np), "err", err)
			p.obs.ListenFailed()
			continue
		}
		p.active[np] = l
	}
	p.obs.Listeners(len(p.active))
}

// Close closes every listener and every connection through them.
func (p *Proxy) Close() {
	p.mu.Lock()
	for np, l := range p.active {
		l.close()
		delete(p.active, np)
	}
	p.obs.Listeners(0)
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}

func (p *Proxy) listen(port Port) (*listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(p.ctx, "tcp", net.JoinHostPort(p.addr.String(), strconv.Itoa(int(port.NodePort))))
	if err != nil {
		return nil, err
	}
	l := &listener{p: p, ln: ln, port: port, sticky: map[netip.Addr]stick{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		l.serve()
	}()
	return l, nil
}

// listener is one NodePort's socket and what its connections are sent to.
type listener struct {
	p  *Proxy
	ln net.Listener

	mu     sync.Mutex
	port   Port
	sticky map[netip.Addr]stick // sessionAffinity: the client's endpoint
}

type stick struct {
	to    netip.AddrPort
	until time.Time
}

func (l *listener) update(port Port) {
	l.mu.Lock()
	l.port = port
	l.mu.Unlock()
}

func (l *listener) close() { _ = l.ln.Close() }

func (l *listener) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.p.log.Error("localhost NodePort listener failed", "servicePort", l.port.Name, "err", err)
			}
			return
		}
		l.p.wg.Add(1)
		go func() {
			defer l.p.wg.Done()
			l.handle(c.(*net.TCPConn))
		}()
	}
}

// pick chooses the endpoint for a client: the one it had within the
// affinity timeout if that endpoint is still there, else one at random.
func (l *listener) pick(client netip.Addr) (netip.AddrPort, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	eps := l.port.Endpoints
	if len(eps) == 0 {
		return netip.AddrPort{}, l.port.Name, false
	}
	now := l.p.now()
	if s, ok := l.sticky[client]; ok && l.port.Affinity > 0 && now.Before(s.until) && contains(eps, s.to) {
		l.sticky[client] = stick{to: s.to, until: now.Add(l.port.Affinity)}
		return s.to, l.port.Name, true
	}
	to := eps[rand.IntN(len(eps))]
	if l.port.Affinity > 0 {
		l.forgetExpired(now)
		l.sticky[client] = stick{to: to, until: now.Add(l.port.Affinity)}
	}
	return to, l.port.Name, true
}

// forgetExpired drops the affinities past their timeout once there are
// many (clients are loopback addresses: few, in practice).
func (l *listener) forgetExpired(now time.Time) {
	if len(l.sticky) < 256 {
		return
	}
	for c, s := range l.sticky {
		if !now.Before(s.until) {
			delete(l.sticky, c)
		}
	}
}

func contains(eps []netip.AddrPort, ep netip.AddrPort) bool {
	for _, e := range eps {
		if e == ep {
			return true
		}
	}
	return false
}
