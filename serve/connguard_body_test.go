package serve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// slowFlood is what the clients of a flood saw.
type slowFlood struct {
	dialed, answered atomic.Int64 // connections opened; answers read (any status)
	firstStatus      sync.Map     // status line -> true
}

// floodSlowBodies runs n clients against addr until ctx ends, each opening
// a connection, sending the headers of `POST path` with a 200,000-byte
// body and then trickling the body a byte every 100 ms, reading whatever
// the server answers; a client opens a new connection as soon as the
// server closes its own, as an attacker would.
func floodSlowBodies(ctx context.Context, addr, path string, n int) *slowFlood {
	f := &slowFlood{}
	for range n {
		go func() {
			for ctx.Err() == nil {
				f.slowBody(ctx, addr, path)
			}
		}()
	}
	return f
}

func (f *slowFlood) slowBody(ctx context.Context, addr, path string) {
	c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return
	}
	defer c.Close()
	f.dialed.Add(1)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	go func() { // read the answer, if any: the server may answer early
		if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			f.answered.Add(1)
			f.firstStatus.Store(strings.TrimSpace(line), true)
		}
	}()
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 200000\r\n\r\n", path); err != nil {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := c.Write([]byte{'x'}); err != nil {
			return
		}
	}
}

func (f *slowFlood) statuses() string {
	var out []string
	f.firstStatus.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	return strings.Join(out, ", ")
}

// A flood of clients that each send a request with a large body a byte at
// a time, more of them than a server's cap, must not make the kubelet's
// probes fail: every probe of /livez during the flood gets 200. Before the
// fix, such a connection counted as busy for as long as net/http read its
// body (up to ReadTimeout, at the client's pace), so the flood filled the
// cap with connections that could not be evicted and the probes were
// refused.
func TestConnGuardSlowBodyFlood(t *testing.T) {
	limits := testLimits()
	limits.ReadTimeout, limits.WriteTimeout = 10*time.Second, 10*time.Second // the defaults' order
	limits.MaxConnsPerServer = 16
	g := NewConnGuard(limits, nil)
	health := NewHealth(time.Minute)
	health.Updated()
	addr := serveOn(t, g, "health", health.Handler())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flood := floodSlowBodies(ctx, addr, "/livez", 20)
	testutil.WaitFor(t, 5*time.Second, "20 slow-body connections", func() bool { return flood.dialed.Load() >= 20 })
	var failed []string
	const probes = 24
	for i := range probes {
		time.Sleep(40 * time.Millisecond) // probes spread over about a second, as a prober's
		if code, _, err := get("http://" + addr + "/livez"); err != nil || code != http.StatusOK {
			failed = append(failed, fmt.Sprintf("probe %d: %d %v", i, code, err))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d probes of /livez failed during a flood of 20 slow-body clients (cap %d):\n%s",
			len(failed), probes, limits.MaxConnsPerServer, strings.Join(failed, "\n"))
	}
	t.Logf("flood: %d connections, %d answered (%s)", flood.dialed.Load(), flood.answered.Load(), flood.statuses())
}

// A request that carries a body (a Content-Length or a Transfer-Encoding)
// is answered 413 at once and its connection closed, without the body
// being read; requests without one are served as before.
func TestConnGuardRefusesBodies(t *testing.T) {
	g := NewConnGuard(testLimits(), slog.New(slog.DiscardHandler))
	dropped := make(chan string, 10)
	g.OnDropped = func(server, reason string) { dropped <- server + "/" + reason }
	served := make(chan string, 10)
	addr := serveOn(t, g, "health", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Method
	}))
	for _, tc := range []struct {
		name, head string
		wantCode   int
	}{
		{"content-length", "POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n", http.StatusRequestEntityTooLarge},
		{"chunked", "POST /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", http.StatusRequestEntityTooLarge},
		{"expect-continue", "PUT /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", http.StatusRequestEntityTooLarge},
		{"GET with an empty body", "GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusOK},
		{"HEAD", "HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := fmt.Fprint(c, tc.head); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(c)
			resp, err := http.ReadResponse(r, &http.Request{Method: strings.Fields(tc.head)[0]})
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("reading the answer's body: %v", err)
			}
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantCode)
			}
			if tc.wantCode == http.StatusOK {
				<-served
				return
			}
			if !strings.Contains(string(body), "not accepted") {
				t.Errorf("the 413 says %q", body)
			}
			if !resp.Close {
				t.Errorf("the 413 does not say Connection: close")
			}
			if err := waitClosed(c, r, time.Now().Add(time.Second)); err != nil {
				t.Errorf("after the 413: %v; want the connection closed at once", err)
			}
			if d := <-dropped; d != "health/body" {
				t.Errorf("dropped %s, want health/body", d)
			}
		})
	}
	select {
	case m := <-served:
		t.Errorf("the handler ran for a %s with a body", m)
	default:
	}
}

// Clients that ask for a large answer and never read it hold our handler
// in its write: such a connection counts as busy for busyAtMost only, then
// it may be closed to make room, so a prober is answered while the cap is
// full of them. Without the bound they would hold the cap until
// WriteTimeout.
func TestConnGuardSlowReaders(t *testing.T) {
	limits := testLimits()
	limits.ReadTimeout, limits.WriteTimeout = 10*time.Second, 10*time.Second
	limits.MaxConnsPerServer = 16
	g := NewConnGuard(limits, nil)
	g.busyAtMost = 200 * time.Millisecond
	var writing atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		writing.Add(1)
		defer writing.Add(-1)
		chunk := make([]byte, 64<<10)
		for { // until the connection is closed: more than any socket buffer holds
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {})
	addr := serveOn(t, g, "metrics", mux)

	for range 20 {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.(*net.TCPConn).SetReadBuffer(2048)
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	testutil.WaitFor(t, 5*time.Second, "every handler blocked writing to a client that does not read", func() bool {
		return writing.Load() >= int64(limits.MaxConnsPerServer)
	})
	time.Sleep(g.busyAtMost) // the handlers have been blocked for busyAtMost
	for i := range 10 {
		if code, _, err := get("http://" + addr + "/livez"); err != nil || code != http.StatusOK {
			t.Errorf("probe %d while the cap is full of slow readers: %d %v; want 200", i, code, err)
		}
	}
}
