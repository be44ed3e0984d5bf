package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Limits bound what the clients of our HTTP servers (the health
// server, the metrics server, every healthCheckNodePort server) can hold,
// so that connections left open, or opened by the thousand, never take
// the file descriptors the proxy needs for its own work (netlink sockets,
// the state directory, conntrack, the API server).
type Limits struct {
	// ReadHeaderTimeout bounds the wait for a request's headers (also
	// for the first request of a connection that sends nothing);
	// ReadTimeout the whole request, WriteTimeout the answer.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new
	// request within it.
	IdleTimeout time.Duration
	// MaxConnsPerServer caps one server's open connections; MaxConns
	// all servers' together.
	MaxConnsPerServer, MaxConns int
}

// Defaults of Limits. A prober or a scraper sends a request every few
// seconds (load balancers every 2-10 s, Prometheus every 15-60 s): the idle
// timeout keeps their keep-alive connection between probes but not an
// abandoned one for long. Every answer is small and quick, so 10 s bounds
// a request and its answer with a wide margin.
const (
	defaultReadHeaderTimeout = 5 * time.Second
	defaultReadTimeout       = 10 * time.Second
	defaultWriteTimeout      = 10 * time.Second
	defaultIdleTimeout       = 30 * time.Second
	defaultMaxConnsPerServer = 1024
	defaultMaxConns          = 8192
	minMaxConns              = 16
)

// DefaultLimits are the defaults, with MaxConns at most half the
// process's open file limit (Go raises the soft limit to the hard one at
// start): the other half is kept for the proxy's own work. One server gets
// at most a quarter of MaxConns, so that a flood of one port leaves room
// for the others.
func DefaultLimits() Limits {
	maxConns := defaultMaxConns
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur/2 < uint64(maxConns) {
		maxConns = max(int(lim.Cur/2), minMaxConns)
	}
	return Limits{
		ReadHeaderTimeout: defaultReadHeaderTimeout, ReadTimeout: defaultReadTimeout,
		WriteTimeout: defaultWriteTimeout, IdleTimeout: defaultIdleTimeout,
		MaxConnsPerServer: min(defaultMaxConnsPerServer, max(maxConns/4, minMaxConns)),
		MaxConns:          maxConns,
	}
}

// ConnGuard counts and caps the connections of all our HTTP servers.
//
// When a new connection would go over a cap, a connection waiting without
// our handler running for it (idle between keep-alive requests, not yet
// done sending its first request's headers, or being written its answer)
// is closed to make room: the longest-waiting one of the client host that
// holds the most such connections, so that a flood from one host never
// closes another host's prober; only when our handler runs
// for every connection, and has for less than busyAtMost, is the new one
// closed at once. Our handlers answer in microseconds, so a flood of
// connections costs a prober nothing, whatever those connections do: it
// gets an answer, and the flood's connections are the ones closed. Closing
// at once rather than leaving new connections in the listen backlog keeps
// the backlog short, so that a prober arriving after a flood is not queued
// behind it, and tells the client at once; it costs one descriptor for an
// instant, per server, as Accept and the close happen in the server's
// accept loop.
//
// "Busy" follows our handler, not net/http's StateActive: net/http keeps a
// connection active while it reads the rest of a request body after the
// handler (up to 256 KiB, at the client's pace, until ReadTimeout) and
// while it writes the answer to a client that does not read, so a pod
// trickling bodies or not reading answers could fill a server's cap with
// connections that look busy. A handler that runs longer than busyAtMost
// is one blocked writing to such a client: it may be closed too. And no
// request may carry a body (none of our servers takes one): such a request
// is answered 413 and its connection closed before a byte of the body is
// read (OnDropped's reason "body").
type ConnGuard struct {
	limits Limits
	log    *slog.Logger
	// OnDropped, when set, is called for each connection closed for the
	// caps: reason "evicted" (closed to make room) or "refused" (closed
	// at once), or for a request with a body: reason "body". Set it
	// before the first server starts.
	OnDropped func(server, reason string)
	now       func() time.Time
	// busyAtMost is how long a handler counts as busy (defaultBusyAtMost).
	busyAtMost time.Duration

	mu      sync.Mutex
	total   int
	servers map[*serverConns]bool
	warned  map[string]time.Time // last warning per server
	held    map[string]int       // drops not logged since
}

// dropLogInterval is the least time between two warnings of one server
// about dropped connections.
const dropLogInterval = time.Minute

// defaultBusyAtMost is how long a handler of ours counts as busy: they
// answer in microseconds (a /metrics scrape in milliseconds), so one that
// runs longer waits for a client that does not read its answer.
const defaultBusyAtMost = time.Second

// NewConnGuard returns a guard with the given limits.
func NewConnGuard(limits Limits, log *slog.Logger) *ConnGuard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ConnGuard{limits: limits, log: log, now: time.Now, busyAtMost: defaultBusyAtMost,
		servers: map[*serverConns]bool{}, warned: map[string]time.Time{}, held: map[string]int{}}
}

// Limits returns the guard's limits.
func (g *ConnGuard) Limits() Limits { return g.limits }

// Open returns the number of open connections of all servers.
func (g *ConnGuard) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total
}

// serverConns are one server's connections, under ConnGuard.mu.
type serverConns struct {
	name  string
	conns map[net.Conn]*connInfo
}

type connInfo struct {
	busy  bool      // our handler runs for it
	since time.Time // when it was accepted, its handler started or it last became idle
	host  string    // the client's address (hostOf)
}

// waitingSince is when the connection began to wait without our handler
// running for it, counting a handler that has run busyAtMost as waiting
// from then; ok is false while it is busy.
func (ci *connInfo) waitingSince(now time.Time, busyAtMost time.Duration) (time.Time, bool) {
	if !ci.busy {
		return ci.since, true
	}
	stuck := ci.since.Add(busyAtMost)
	return stuck, !stuck.After(now)
}

// connKey is the context key of a request's net.Conn.
type connKey struct{}

// NewServer returns an HTTP server for h with the guard's timeouts, its
// connections counted and capped. name labels it in logs and metrics.
func (g *ConnGuard) NewServer(name string, h http.Handler) *Server {
	s := &serverConns{name: name, conns: map[net.Conn]*connInfo{}}
	g.mu.Lock()
	g.servers[s] = true
	g.mu.Unlock()
	l := g.limits
	return &Server{guard: g, conns: s, Server: &http.Server{
		Handler: g.handler(s, h),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout,
		WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout,
		MaxHeaderBytes: 16 << 10, // requests here are a GET line and a few headers
		ConnState:      func(c net.Conn, st http.ConnState) { g.connState(s, c, st) },
		// Accept errors ("too many open files") are worth seeing.
		ErrorLog: slog.NewLogLogger(g.log.With("server", name).Handler(), slog.LevelWarn),
	}}
}

// connState follows a connection through the server's states (http.Server
// calls it for StateNew in its accept loop, before serving the connection).
func (g *ConnGuard) connState(s *serverConns, c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		g.admit(s, c)
	case http.StateIdle:
		g.setBusy(s, c, false)
	case http.StateHijacked, http.StateClosed:
		g.mu.Lock()
		if s.conns[c] != nil {
			delete(s.conns, c)
			g.total--
		}
		g.mu.Unlock()
	}
}

// handler wraps h: a request with a body is refused, and the connection
// counts as busy while h runs.
func (g *ConnGuard) handler(s *serverConns, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			g.refuseBody(s, w)
			return
		}
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		g.setBusy(s, c, true)
		defer g.setBusy(s, c, false)
		h.ServeHTTP(w, r)
	})
}

// setBusy records that our handler starts or ends for c.
func (g *ConnGuard) setBusy(s *serverConns, c net.Conn, busy bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ci := s.conns[c]; ci != nil {
		ci.busy, ci.since = busy, g.now()
	}
}

// bodyRefused is the whole answer to a request with a body.
const bodyRefused = "HTTP/1.1 413 Request Entity Too Large\r\n" +
	"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 32\r\n\r\n" +
	"request bodies are not accepted\n"

// refuseBody answers 413 and closes the connection without reading the
// request's body. It takes the connection from net/http (which would read
// up to 256 KiB of the body after the handler, holding the connection at
// the client's pace) and writes the answer itself: a fresh connection's
// send buffer takes it without blocking.
func (g *ConnGuard) refuseBody(s *serverConns, w http.ResponseWriter) {
	if g.OnDropped != nil {
		g.OnDropped(s.name, "body")
	}
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil { // not HTTP/1: net/http closes the stream after the answer
		w.Header().Set("Connection", "close")
		http.Error(w, "request bodies are not accepted", http.StatusRequestEntityTooLarge)
		return
	}
	defer c.Close()
	_ = c.SetWriteDeadline(g.now().Add(time.Second))
	_, _ = io.WriteString(c, bodyRefused)
}

// admit counts a new connection, making room for it over a cap by closing
// a waiting one (victim), or closes it at once when none is waiting.
func (g *ConnGuard) admit(s *serverConns, c net.Conn) {
	g.mu.Lock()
	if !g.servers[s] { // closed while this one was accepted
		g.mu.Unlock()
		_ = c.Close()
		return
	}
	var victim net.Conn
	var from *serverConns
	switch {
	case len(s.conns) >= g.limits.MaxConnsPerServer:
		cand := s.victim(g.now(), g.busyAtMost)
		from, victim = cand.from, cand.conn
	case g.total >= g.limits.MaxConns:
		cand := g.victim()
		from, victim = cand.from, cand.conn
	default:
		s.conns[c] = &connInfo{since: g.now(), host: hostOf(c)}
		g.total++
		g.mu.Unlock()
		return
	}
	reason := "refused"
	if victim != nil {
		delete(from.conns, victim)
		s.conns[c] = &connInfo{since: g.now(), host: hostOf(c)}
		reason = "evicted"
	} else {
		victim = c
	}
	logIt, held := g.noteDrop(s.name)
	g.mu.Unlock()
	_ = victim.Close()
	if g.OnDropped != nil {
		g.OnDropped(s.name, reason)
	}
	if logIt {
		g.log.Warn("too many connections to an HTTP server: closing the longest idle ones, or new ones while all are busy",
			"server", s.name, "reason", reason, "max_per_server", g.limits.MaxConnsPerServer,
			"max_all_servers", g.limits.MaxConns, "dropped_since_last_warning", held)
	}
}

// noteDrop counts a dropped connection of a server and reports whether to
// warn now (at most once per dropLogInterval) and how many drops the
// warning covers. Under g.mu.
func (g *ConnGuard) noteDrop(server string) (bool, int) {
	g.held[server]++
	now := g.now()
	if last, ok := g.warned[server]; ok && now.Sub(last) < dropLogInterval {
		return false, 0
	}
	n := g.held[server]
	g.warned[server], g.held[server] = now, 0
	return true, n
}

// candidate is a connection that may be closed to make room: the one
// that has waited longest of its client host's, with how many waiting
// connections that host holds.
type candidate struct {
	conn    net.Conn
	from    *serverConns
	since   time.Time
	waiting int // the host's waiting connections
}

// better reports whether c should be closed before o: the host holding
// more waiting connections first, then the connection waiting longer. So
// a flood from one host closes its own connections, never a prober's
// single one, however long the prober's headers take on a loaded node.
func (c candidate) better(o candidate) bool {
	if o.conn == nil || c.waiting != o.waiting {
		return o.conn == nil || c.waiting > o.waiting
	}
	return c.since.Before(o.since)
}

// victim is the server's connection to close to make room: among those
// waiting without our handler running for them (or with one running
// busyAtMost), the longest-waiting one of the host with the most.
// Under ConnGuard.mu.
func (s *serverConns) victim(now time.Time, busyAtMost time.Duration) candidate {
	perHost := map[string]int{}
	for _, ci := range s.conns {
		if _, ok := ci.waitingSince(now, busyAtMost); ok {
			perHost[ci.host]++
		}
	}
	var best candidate
	for c, ci := range s.conns {
		if since, ok := ci.waitingSince(now, busyAtMost); ok {
			if cand := (candidate{c, s, since, perHost[ci.host]}); cand.better(best) {
				best = cand
			}
		}
	}
	return best
}

// victim is victim over all servers. Under g.mu.
func (g *ConnGuard) victim() candidate {
	var best candidate
	now := g.now()
	for s := range g.servers {
		if cand := s.victim(now, g.busyAtMost); cand.conn != nil && cand.better(best) {
			best = cand
		}
	}
	return best
}

// hostOf is the client's address of c, without its port.
func hostOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// Server is an HTTP server whose connections a ConnGuard counts.
type Server struct {
	*http.Server
	guard *ConnGuard
	conns *serverConns
}

// Close closes the server, its listeners and its connections, and takes
// them off the guard's count.
func (s *Server) Close() error {
	err := s.Server.Close()
	g := s.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.servers[s.conns] {
		delete(g.servers, s.conns)
		g.total -= len(s.conns.conns)
		clear(s.conns.conns)
	}
	return err
}

// ServeUntil runs s on ln until ctx ends (then closes it, with its
// connections); an error other than the server closing is logged.
func (s *Server) ServeUntil(ctx context.Context, ln net.Listener, log *slog.Logger) {
	go func() {
		<-ctx.Done()
		_ = s.Close()
	}()
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(fmt.Sprintf("%s server stopped", s.conns.name), "err", err)
		}
	}()
}
