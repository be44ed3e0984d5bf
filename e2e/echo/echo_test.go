package echo

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReplyRoundTrip(t *testing.T) {
	for _, ap := range []netip.AddrPort{
		netip.MustParseAddrPort("10.244.0.10:41234"),
		netip.MustParseAddrPort("[fd00:10:244::10]:8080"),
		netip.MustParseAddrPort("[::ffff:10.99.0.2]:53"), // v4-mapped, from a dual-stack socket
	} {
		line := Reply("pod-a", ap)
		name, src, err := ParseReply(line + "\n")
		if err != nil || name != "pod-a" || src.Addr() != ap.Addr().Unmap() || src.Port() != ap.Port() {
			t.Errorf("ParseReply(%q) = %q, %v, %v", line, name, src, err)
		}
	}
	for _, bad := range []string{"", "pod-a", "pod-a nonsense", " 10.0.0.1:1"} {
		if _, _, err := ParseReply(bad); err == nil {
			t.Errorf("ParseReply(%q) succeeded", bad)
		}
	}
}

// serve starts a server on loopback for the test.
func serve(t *testing.T, name string) *Server {
	t.Helper()
	srv, err := Listen(name, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

func TestClientServer(t *testing.T) {
	srv := serve(t, "pod-a")
	for _, network := range []string{"tcp", "udp"} {
		addr := srv.TCPAddr().String()
		if network == "udp" {
			addr = srv.UDPAddr().String()
		}
		sum, err := Run(t.Context(), ClientConfig{Network: network, Addr: addr, Count: 5, Timeout: time.Second, Results: ResultsAll})
		if err != nil {
			t.Fatal(err)
		}
		if !sum.Success(false) || sum.OK != 5 || sum.Backend["pod-a"] != 5 || sum.Sources["127.0.0.1"] != 5 || len(sum.Results) != 5 {
			t.Errorf("%s: %+v", network, sum)
		}
		// A fixed source port, over and over: the same 5-tuple.
		port := freePort(t, network)
		sum, err = Run(t.Context(), ClientConfig{Network: network, Addr: addr, Count: 20, Timeout: time.Second, SrcPort: port, Results: ResultsAll})
		if err != nil {
			t.Fatal(err)
		}
		if sum.OK != 20 {
			t.Errorf("%s with source port %d: %+v", network, port, sum)
		}
		for _, r := range sum.Results {
			if ap, err := netip.ParseAddrPort(r.Source); err != nil || int(ap.Port()) != port {
				t.Errorf("%s: source %q, want port %d", network, r.Source, port)
			}
		}
	}
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "tcp" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func TestHTTP(t *testing.T) {
	srv := serve(t, "pod-b")
	resp, err := http.Get("http://" + srv.TCPAddr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(string(body), "pod-b 127.0.0.1:") {
		t.Errorf("GET: %d %q %v", resp.StatusCode, body, err)
	}
}

func TestSilentTCPClient(t *testing.T) {
	srv := serve(t, "pod-a")
	c, err := net.Dial("tcp", srv.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c) // sends nothing; the server answers after peekTimeout and closes
	if err != nil || !strings.HasPrefix(string(b), "pod-a 127.0.0.1:") {
		t.Errorf("got %q, %v", b, err)
	}
}

func TestFailures(t *testing.T) {
	tcpPort, udpPort := freePort(t, "tcp"), freePort(t, "udp")
	for _, tc := range []struct {
		network, addr, kind string
	}{
		{"tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tcpPort)), "refused"},
		{"udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(udpPort)), "refused"},
	} {
		sum, err := Run(t.Context(), ClientConfig{Network: tc.network, Addr: tc.addr, Count: 3, Timeout: time.Second, Results: ResultsFailed})
		if err != nil {
			t.Fatal(err)
		}
		if sum.Success(false) || sum.Failed != 3 || sum.Errors[tc.kind] != 3 || len(sum.Results) != 3 {
			t.Errorf("%s %s: %+v", tc.network, tc.addr, sum)
		}
		sum, _ = Run(t.Context(), ClientConfig{Network: tc.network, Addr: tc.addr, Count: 3, Timeout: time.Second, UntilFail: true})
		if sum.Failed != 1 {
			t.Errorf("until-fail: %+v", sum)
		}
	}
}

func TestUntilOK(t *testing.T) {
	srv := serve(t, "pod-a")
	sum, err := Run(t.Context(), ClientConfig{Network: "tcp", Addr: srv.TCPAddr().String(), Count: 10, Timeout: time.Second, UntilOK: true})
	if err != nil || sum.OK != 1 || !sum.Success(true) {
		t.Errorf("%+v %v", sum, err)
	}
}

func TestOnReplyCounts(t *testing.T) {
	srv := serve(t, "pod-a")
	var seen []int
	cfg := ClientConfig{Network: "udp", Addr: srv.UDPAddr().String(), Count: 4, Timeout: time.Second,
		OnReply: func(ok int) { seen = append(seen, ok) }}
	sum, err := Run(t.Context(), cfg)
	if err != nil || sum.OK != 4 || !slices.Equal(seen, []int{1, 2, 3, 4}) {
		t.Errorf("summary %+v, error %v, OnReply saw %v; want 1, 2, 3, 4", sum, err, seen)
	}
}

// TestClientConfigJSON: a configuration travels to a client in another
// namespace as JSON (the VM tier's tests), callbacks left behind.
func TestClientConfigJSON(t *testing.T) {
	in := ClientConfig{Network: "tcp", Addr: "10.96.0.10:80", Count: 3, Timeout: time.Second, OnReply: func(int) {}}
	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out ClientConfig
	if err := json.Unmarshal(js, &out); err != nil || out.Addr != in.Addr || out.Count != in.Count || out.Timeout != in.Timeout {
		t.Errorf("%s came back as %+v (%v)", js, out, err)
	}
}

func TestDurationBounds(t *testing.T) {
	srv := serve(t, "pod-a")
	start := time.Now()
	sum, err := Run(t.Context(), ClientConfig{Network: "tcp", Addr: srv.TCPAddr().String(), Duration: 300 * time.Millisecond, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ran %v", d)
	}
	if sum.OK == 0 || sum.Failed != 0 {
		t.Errorf("%+v", sum)
	}
}

func TestConfigValidation(t *testing.T) {
	good := ClientConfig{Network: "tcp", Addr: "127.0.0.1:1", Count: 1, Timeout: time.Second}
	for _, mod := range []func(*ClientConfig){
		func(c *ClientConfig) { c.Network = "sctp" },
		func(c *ClientConfig) { c.Addr = "127.0.0.1" },
		func(c *ClientConfig) { c.Count = 0 },
		func(c *ClientConfig) { c.Count = MaxCount + 1 },
		func(c *ClientConfig) { c.Timeout = 0 },
		func(c *ClientConfig) { c.Duration = MaxDuration + 1 },
		func(c *ClientConfig) { c.SrcPort = 70000 },
		func(c *ClientConfig) { c.UntilFail, c.UntilOK = true, true },
		func(c *ClientConfig) { c.Results = "some" },
	} {
		c := good
		mod(&c)
		if _, err := Run(t.Context(), c); err == nil {
			t.Errorf("Run(%+v) accepted", c)
		}
	}
}

// The longest gap covers a stretch with no server: a run against a closed
// port has its whole length as the gap; a run against a live server has
// gaps about as long as its interval.
func TestClientLongestGap(t *testing.T) {
	srv := serve(t, "pod-a")
	sum, err := Run(t.Context(), ClientConfig{Network: "tcp", Addr: srv.TCPAddr().String(), Count: 5, Timeout: time.Second, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if sum.OK != 5 || sum.LongestGapMS < 20 || sum.LongestGapMS > sum.ElapsedMS {
		t.Errorf("live server: ok %d, longest gap %.1f ms of %.1f ms, want 5 replies and a gap of 20 ms to the whole run", sum.OK, sum.LongestGapMS, sum.ElapsedMS)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	sum, err = Run(t.Context(), ClientConfig{Network: "tcp", Addr: addr, Count: 3, Timeout: time.Second, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if sum.OK != 0 || sum.LongestGapMS != sum.ElapsedMS || sum.LongestGapAtMS != 0 {
		t.Errorf("no server: ok %d, longest gap %.1f ms at %.1f of %.1f ms, want the whole run", sum.OK, sum.LongestGapMS, sum.LongestGapAtMS, sum.ElapsedMS)
	}
}
