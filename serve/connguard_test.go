package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// testLimits are small caps and a short idle timeout, so that a flood
// beyond the caps takes a few hundred connections and a fraction of a
// second.
func testLimits() Limits {
	return Limits{
		ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		IdleTimeout: 400 * time.Millisecond, MaxConnsPerServer: 20, MaxConns: 50,
	}
}

// serveOn runs a guarded server for h on 127.0.0.1 and returns its address.
func serveOn(t *testing.T, g *ConnGuard, name string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g.NewServer(name, h).ServeUntil(ctx, ln, slog.New(slog.DiscardHandler))
	return ln.Addr().String()
}

// keepAlive opens a connection to addr, sends one keep-alive GET of path
// and reads the answer, leaving the connection open and idle. It returns
// the connection (nil if closed before an answer) and its reader.
func keepAlive(t *testing.T, addr, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		c.Close()
		return nil, nil
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		c.Close()
		return nil, nil // closed for the caps
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, r
}

// get GETs url on a new connection (no keep-alive), as a prober does.
func get(url string) (int, string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitClosed waits, at most until deadline, for the server to close c
// (a read returns EOF or an error other than our deadline).
func waitClosed(c net.Conn, r *bufio.Reader, deadline time.Time) error {
	_ = c.SetReadDeadline(deadline)
	_, err := r.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("still open at the deadline")
	}
	if err == nil {
		return fmt.Errorf("the server sent unasked bytes")
	}
	return nil
}

// A flood of idle keep-alive connections, beyond the caps, to the health
// server, the metrics server and a health check node port: every server
// still answers a new prober at once, the proxy never holds more than the
// caps, the drops are counted, and the idle connections are closed after
// the idle timeout. Without the caps and the idle timeout the flood's
// connections stay open for good (each an fd of the proxy's).
func TestConnGuardIdleFlood(t *testing.T) {
	limits := testLimits()
	var logged lockedBuffer
	g := NewConnGuard(limits, slog.New(slog.NewTextHandler(&logged, nil)))
	health := NewHealth(time.Minute)
	health.Updated()
	metrics := NewMetrics()
	g.OnDropped = metrics.CountDroppedConn
	healthAddr := serveOn(t, g, "health", health.Handler())
	metricsAddr := serveOn(t, g, "metrics", metrics.Handler("nftables"))
	hcPort := freePort(t)
	hc := &HealthChecks{Host: "127.0.0.1", Guard: g}
	defer hc.Close(context.Background())
	hc.Update(hcState(hcPort))
	hcAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hcPort).String()

	type held struct {
		c net.Conn
		r *bufio.Reader
	}
	var flood []held
	t.Cleanup(func() {
		for _, h := range flood {
			h.c.Close()
		}
	})
	for _, target := range []struct{ addr, path string }{{healthAddr, "/healthz"}, {metricsAddr, "/metrics"}, {hcAddr, "/"}} {
		for range limits.MaxConnsPerServer + 15 {
			if c, r := keepAlive(t, target.addr, target.path); c != nil {
				flood = append(flood, held{c, r})
			}
		}
	}
	if open := g.Open(); open > limits.MaxConns {
		t.Errorf("%d connections open, over the cap of %d", open, limits.MaxConns)
	}
	// New probers are answered at once.
	for _, url := range []string{"http://" + healthAddr + "/healthz", "http://" + hcAddr + "/", "http://" + metricsAddr + "/metrics"} {
		if code, _, err := get(url); err != nil || code != http.StatusOK {
			t.Errorf("GET %s during the flood: %d, %v; want 200", url, code, err)
		}
	}
	_, body, err := get("http://" + metricsAddr + "/metrics")
	if err != nil || !strings.Contains(body, `kubenftproxy_http_connections_dropped_total{reason="evicted",server="health"}`) {
		t.Errorf("the metrics do not count the dropped connections (%v):\n%s", err, grepLines(body, "http_connections"))
	}
	// The flood's connections still open are closed after the idle
	// timeout, and none is left on the count.
	deadline := time.Now().Add(limits.IdleTimeout + 3*time.Second)
	for i, h := range flood {
		if err := waitClosed(h.c, h.r, deadline); err != nil {
			t.Fatalf("idle connection %d of %d: %v (idle timeout %v)", i, len(flood), err, limits.IdleTimeout)
		}
	}
	for g.Open() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the count, with a deadline
	}
	if open := g.Open(); open != 0 {
		t.Errorf("%d connections still counted after every one was closed", open)
	}
	// The drops are logged, once per server within a minute.
	if n := strings.Count(logged.String(), "too many connections"); n < 1 || n > 3 {
		t.Errorf("%d warnings about dropped connections, want 1 to 3 (one per server at most):\n%s", n, logged.String())
	}
}

// lockedBuffer is a log destination written by the servers' goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hcState is a State with one externalTrafficPolicy Local Service with a
// local endpoint, whose health check node port is port.
func hcState(port uint16) *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	name := model.ServicePortName{Namespace: "default", Name: "lb", Port: "http"}
	st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80, NodePort: 30080, HealthCheckNodePort: port,
		ExternalPolicyLocal: true, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")}})
	st.Endpoints = st.Endpoints.With(name, []model.Endpoint{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, NodeName: "node-1", Ready: true, Serving: true}})
	return st
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// When every connection of a server has our handler running, a new one
// is closed at once (refused) rather than evicting a busy one; the
// connections over the cap of all servers together are refused too.
func TestConnGuardRefusesWhenAllBusy(t *testing.T) {
	limits := testLimits()
	limits.MaxConnsPerServer, limits.MaxConns = 3, 4
	g := NewConnGuard(limits, nil)
	dropped := make(chan string, 10)
	g.OnDropped = func(server, reason string) { dropped <- server + "/" + reason }
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		<-release
	})
	addr := serveOn(t, g, "slow", slow)
	defer close(release)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range limits.MaxConnsPerServer {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		<-started
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if err := waitClosed(c, bufio.NewReader(c), time.Now().Add(2*time.Second)); err != nil {
		t.Errorf("a connection over the cap while all are busy: %v; want it closed at once", err)
	}
	select {
	case d := <-dropped:
		if d != "slow/refused" {
			t.Errorf("dropped %s, want slow/refused", d)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("the refused connection was not counted")
	}
	if open := g.Open(); open != limits.MaxConnsPerServer {
		t.Errorf("%d connections counted, want %d", open, limits.MaxConnsPerServer)
	}
}

// The default limits keep the connections of all servers at most half the
// open file limit, and one server's at most a quarter of that.
func TestDefaultLimits(t *testing.T) {
	l := DefaultLimits()
	if l.IdleTimeout <= 0 || l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.ReadHeaderTimeout <= 0 {
		t.Errorf("a timeout is unset: %+v", l)
	}
	if l.MaxConns < minMaxConns || l.MaxConns > defaultMaxConns || l.MaxConnsPerServer > l.MaxConns {
		t.Errorf("caps out of range: %+v", l)
	}
}

// A flood from one host fills a server's cap with connections that send
// nothing, after a prober on another host has connected and not yet sent
// its headers (a loaded node): the flood's newest connections evict the
// flood's own oldest, never the prober's, which then gets its answer.
// Closing the longest-waiting connection whatever its host closed the
// prober's first.
func TestConnGuardEvictsTheFloodingHost(t *testing.T) {
	limits := testLimits()
	limits.MaxConnsPerServer = 5
	g := NewConnGuard(limits, nil)
	addr := serveOn(t, g, "health", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	}))
	dialFrom := func(local string) net.Conn {
		t.Helper()
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", local, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	waitOpen := func(n int) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for g.Open() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections counted, want %d", g.Open(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	prober := dialFrom("127.0.0.2")
	waitOpen(1)
	for i := range 2 * limits.MaxConnsPerServer {
		dialFrom("127.0.0.1")
		waitOpen(min(i+2, limits.MaxConnsPerServer))
	}
	fmt.Fprintf(prober, "GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	_ = prober.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(prober), nil)
	if err != nil {
		t.Fatalf("the prober's connection after the flood: %v; want an answer", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("prober got %d, want 200", resp.StatusCode)
	}
}
