package cluster

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestStreamStatsGaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	fail := errors.New("timeout")
	for _, tc := range []struct {
		name           string
		events         []error // one request every 100 ms from 100 ms on
		stop           int     // ms
		failed         int
		longest, endAt int // ms
	}{
		{"all answered", []error{nil, nil, nil}, 300, 0, 100, 100},
		{"an outage in the middle", []error{nil, fail, fail, nil, nil}, 500, 2, 300, 400},
		{"failing at the end", []error{nil, nil, fail, fail}, 1000, 2, 800, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &streamStats{lastOK: t0}
			for i, err := range tc.events {
				s.record(err, 10*time.Millisecond, at(100*(i+1)))
			}
			s.closeGap(at(tc.stop))
			if s.requests != len(tc.events) || s.failed != tc.failed {
				t.Errorf("requests %d failed %d, want %d and %d", s.requests, s.failed, len(tc.events), tc.failed)
			}
			if s.longestGap != time.Duration(tc.longest)*time.Millisecond || !s.gapEnd.Equal(at(tc.endAt)) {
				t.Errorf("longest gap %v ending at %v, want %dms ending at %dms", s.longestGap, s.gapEnd.Sub(t0), tc.longest, tc.endAt)
			}
		})
	}
}

func TestWithNodeSelector(t *testing.T) {
	const ds = "kind: DaemonSet\nspec:\n  template:\n    metadata:\n      labels:\n        a: b\n    spec:\n"
	for _, tc := range []struct{ name, in, want string }{
		{"no nodeSelector", ds + "      hostNetwork: true\n",
			ds + "      nodeSelector:\n        " + switchedLabel + ": \"true\"\n      hostNetwork: true\n"},
		{"a nodeSelector", ds + "      nodeSelector:\n        kubernetes.io/os: linux\n      hostNetwork: true\n",
			ds + "      nodeSelector:\n        " + switchedLabel + ": \"true\"\n        kubernetes.io/os: linux\n      hostNetwork: true\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := withNodeSelector(tc.in, switchedLabel, "true")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, tc.want) || strings.Count(out, "nodeSelector:") != 1 {
				t.Errorf("got\n%s\nwant it to hold\n%s\nwith one nodeSelector", out, tc.want)
			}
		})
	}
	if _, err := withNodeSelector("kind: Service\n", "k", "v"); err == nil {
		t.Error("a manifest without a pod template: no error")
	}
	t.Run("deploy/", func(t *testing.T) {
		deploy, err := DeployManifests(t.Context(), needKubectl(t), deployDir(), "img", "https://api:6443")
		if err != nil {
			t.Fatal(err)
		}
		out, err := withNodeSelector(deploy, switchedLabel, "true")
		if err != nil {
			t.Fatal(err)
		}
		if want := "      nodeSelector:\n        " + switchedLabel + ": \"true\"\n        kubernetes.io/os: linux\n"; !strings.Contains(out, want) {
			t.Errorf("got\n%s\nwant it to hold\n%s", out, want)
		}
	})
}

func TestFlowRecord(t *testing.T) {
	t0 := time.Unix(1000, 0)
	reset := errors.New("connection reset by peer")
	type event struct {
		answer string
		err    error
	}
	for _, tc := range []struct {
		name                      string
		proto                     string
		events                    []event // one every 100 ms from 100 ms on
		look                      int     // ms
		failed, broken, stall, re int     // re: exchanges after which TCP reopens
	}{
		{"answered by one endpoint", "tcp", []event{{"echo-1", nil}, {"echo-1", nil}}, 200, 0, 0, 100, 0},
		{"a TCP reset breaks the connection", "tcp", []event{{"echo-1", nil}, {"", reset}, {"echo-2", nil}}, 300, 1, 1, 200, 1},
		{"a new TCP connection may go elsewhere", "tcp", []event{{"echo-1", nil}, {"", reset}, {"echo-2", nil}, {"echo-2", nil}}, 400, 1, 1, 200, 1},
		{"a lost datagram is a stall", "udp", []event{{"echo-1", nil}, {"", reset}, {"echo-1", nil}}, 300, 1, 0, 200, 0},
		{"a UDP flow moved to another endpoint", "udp", []event{{"echo-1", nil}, {"echo-2", nil}}, 200, 1, 1, 100, 0},
		{"silent since the last answer", "tcp", []event{{"echo-1", nil}}, 900, 0, 0, 800, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flow{flowTarget: flowTarget{proto: tc.proto}, lastOK: t0}
			reopened := 0
			for i, e := range tc.events {
				if f.record(e.answer, e.err, t0.Add(time.Duration(100*(i+1))*time.Millisecond)) {
					reopened++
				}
			}
			w := f.look(t0.Add(time.Duration(tc.look) * time.Millisecond))
			if w.exchanges != len(tc.events) || w.failed != tc.failed || w.broken != tc.broken || reopened != tc.re {
				t.Errorf("exchanges %d failed %d broken %d reopened %d, want %d, %d, %d, %d",
					w.exchanges, w.failed, w.broken, reopened, len(tc.events), tc.failed, tc.broken, tc.re)
			}
			if w.longestStall != time.Duration(tc.stall)*time.Millisecond {
				t.Errorf("longest stall %v, want %dms", w.longestStall, tc.stall)
			}
			if next := f.look(t0.Add(time.Duration(tc.look) * time.Millisecond)); next.exchanges != 0 || next.failed != 0 {
				t.Errorf("the next window starts with %+v, want it empty", next)
			}
			if f.total.exchanges != len(tc.events) {
				t.Errorf("total exchanges %d, want %d", f.total.exchanges, len(tc.events))
			}
		})
	}
}

// TestFlowsHoldTheirConnections runs two long-lived flows (TCP, UDP)
// against local servers that answer as agnhost netexec does: every
// exchange answered on one kept-alive connection, and a server closing
// the connection counts as one break.
func TestFlowsHoldTheirConnections(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: each flow's thread enters a network namespace (setns)")
	}
	var accepted atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "echo-1")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == "hostname" {
				udp.WriteTo([]byte("echo-1"), from)
			}
		}
	}()
	self := "/proc/self/ns/net"
	fs, err := openFlows(context.Background(), []flowTarget{
		{"tcp", "tcp", strings.TrimPrefix(srv.URL, "http://"), self},
		{"udp", "udp", udp.LocalAddr().String(), self},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	// waitExchanges waits until every flow has made n more exchanges.
	waitExchanges := func(n int) {
		t.Helper()
		before := fs.totals()
		err := poll(context.Background(), 10*time.Second, func() (bool, error) {
			for i, r := range fs.totals() {
				if r.exchanges < before[i].exchanges+n {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("fewer than %d exchanges per flow: %+v", n, fs.totals())
		}
	}
	waitExchanges(5)
	for _, r := range fs.look() {
		if r.failed != 0 || r.broken != 0 {
			t.Errorf("%s: %d failed, %d broken: %s", r.name, r.failed, r.broken, r.firstErr)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the TCP flow opened %d connections, want 1", n)
	}
	srv.CloseClientConnections()
	waitExchanges(5)
	got := fs.look()
	if got[0].broken != 1 || got[1].broken != 0 {
		t.Errorf("after the server closed the TCP connection: tcp %d broken, udp %d; want 1 and 0", got[0].broken, got[1].broken)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("the TCP flow opened %d connections in all, want 2", n)
	}
}

func TestTokenTimes(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"iat":1796011200,"exp":1796011800,"sub":"system:serviceaccount:kube-system:kube-nftproxy"}`))
	for tok, want := range map[string]string{
		"h." + payload + ".s": "issued 04:00:00, expires 04:10:00",
		"not-a-token":         "not a JWT",
	} {
		if got := tokenTimes(tok); got != want {
			t.Errorf("tokenTimes(%.20q) = %q, want %q", tok, got, want)
		}
	}
}
