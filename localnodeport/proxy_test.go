package localnodeport

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// backend is an endpoint that answers each connection with its own port,
// then echoes what it is sent until the client's half-close.
func backend(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ap := netip.MustParseAddrPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%d\n", ap.Port())
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ap
}

// freePort is a loopback TCP port nothing listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String()).Port()
}

// ask connects to the NodePort, sends msg, half-closes and returns the
// answer: the endpoint's port line, then msg echoed.
func ask(t *testing.T, np uint16, msg string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(np))), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, msg)
	_ = c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

func newProxy(t *testing.T) (*Proxy, *int) {
	t.Helper()
	n := -1
	p := New(loopback, slog.New(slog.DiscardHandler), Observer{Listeners: func(c int) { n = c }})
	t.Cleanup(p.Close)
	return p, &n
}

func TestSyncListensWhileEndpointsExist(t *testing.T) {
	p, listeners := newProxy(t)
	a, b := backend(t), backend(t)
	np := freePort(t)
	steps := []struct {
		name      string
		eps       []netip.AddrPort
		listeners int
		answer    string // "": refused
	}{
		{"no endpoints: not listened on", nil, 0, ""},
		{"an endpoint", []netip.AddrPort{a}, 1, fmt.Sprintf("%d\nhello", a.Port())},
		{"moved to another endpoint: the same listener", []netip.AddrPort{b}, 1, fmt.Sprintf("%d\nhello", b.Port())},
		{"drained: closed", nil, 0, ""},
	}
	for _, s := range steps {
		p.Sync([]Port{{Name: "default/web:http", NodePort: np, Endpoints: s.eps}})
		got, err := ask(t, np, "hello")
		if *listeners != s.listeners || (s.answer == "") != (err != nil) || got != s.answer {
			t.Errorf("%s: %d listeners, answer %q (%v); want %d, %q", s.name, *listeners, got, err, s.listeners, s.answer)
		}
	}
}

func TestAffinityKeepsTheClientsEndpoint(t *testing.T) {
	p, _ := newProxy(t)
	eps := []netip.AddrPort{backend(t), backend(t), backend(t)}
	np := freePort(t)
	p.Sync([]Port{{Name: "default/sticky:http", NodePort: np, Endpoints: eps, Affinity: time.Hour}})
	first, err := ask(t, np, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if got, err := ask(t, np, ""); got != first || err != nil {
			t.Fatalf("with affinity: %q (%v), then %q", first, err, got)
		}
	}
	// The client's endpoint goes: the next connection takes another.
	var rest []netip.AddrPort
	for _, ep := range eps {
		if fmt.Sprintf("%d\n", ep.Port()) != first {
			rest = append(rest, ep)
		}
	}
	p.Sync([]Port{{Name: "default/sticky:http", NodePort: np, Endpoints: rest, Affinity: time.Hour}})
	if got, err := ask(t, np, ""); got == first || err != nil {
		t.Errorf("after its endpoint went: %q (%v), want another", got, err)
	}
}

func TestWithoutAffinityEveryEndpointServes(t *testing.T) {
	p, _ := newProxy(t)
	eps := []netip.AddrPort{backend(t), backend(t)}
	np := freePort(t)
	p.Sync([]Port{{Name: "default/web:http", NodePort: np, Endpoints: eps}})
	seen := map[string]bool{}
	testutil.WaitFor(t, 10*time.Second, "both endpoints answering", func() bool {
		got, err := ask(t, np, "")
		seen[got] = err == nil
		return len(seen) == 2
	})
}

func TestUnreachableEndpointClosesTheClient(t *testing.T) {
	p, _ := newProxy(t)
	np, dead := freePort(t), freePort(t)
	p.Sync([]Port{{Name: "default/dead:http", NodePort: np, Endpoints: []netip.AddrPort{netip.AddrPortFrom(loopback, dead)}}})
	// Nothing is sent: a request the proxy never read would make its close a reset.
	if got, err := ask(t, np, ""); got != "" || err != nil {
		t.Errorf("an unreachable endpoint: %q (%v), want the connection accepted, then closed", got, err)
	}
}

func TestPortHeldElsewhereIsRetried(t *testing.T) {
	listeners, failures := -1, 0
	p := New(loopback, slog.New(slog.DiscardHandler), Observer{Listeners: func(n int) { listeners = n }, ListenFailed: func() { failures++ }})
	t.Cleanup(p.Close)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	np := netip.MustParseAddrPort(held.Addr().String()).Port()
	ports := []Port{{Name: "default/web:http", NodePort: np, Endpoints: []netip.AddrPort{backend(t)}}}
	p.Sync(ports)
	if listeners != 0 || failures != 1 {
		t.Fatalf("%d listeners, %d failures on a port another socket holds; want 0, 1", listeners, failures)
	}
	_ = held.Close()
	p.Sync(ports)
	if listeners != 1 || failures != 1 {
		t.Errorf("%d listeners, %d failures once the port is free, want 1, 1", listeners, failures)
	}
}

func TestCloseEndsOpenConnections(t *testing.T) {
	p := New(loopback, slog.New(slog.DiscardHandler), Observer{})
	np := freePort(t)
	p.Sync([]Port{{Name: "default/web:http", NodePort: np, Endpoints: []netip.AddrPort{backend(t)}}})
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(np))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line := make([]byte, 6)
	if _, err := io.ReadFull(c, line); err != nil {
		t.Fatal(err)
	}
	p.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(line); err == nil {
		t.Fatal("a connection stayed open after Close")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a connection stayed open after Close: %v", err)
	}
	if _, err := ask(t, np, ""); err == nil {
		t.Error("the NodePort still answers after Close")
	}
}
