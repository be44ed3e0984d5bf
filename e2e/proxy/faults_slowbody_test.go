package proxy

// A pod that floods the health port with requests whose bodies it sends a
// byte at a time (issue "Never blind, never blocked", item 5) must not make
// the kubelet's probes fail.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	// slowBodyClients is how many clients of pod-c keep a slow-body
	// request open to the health port: about twice the health server's
	// cap under listenFDLimit (a quarter of half the limit: 32).
	slowBodyClients = 64
	// slowBodyProbes is how many probes of /livez the kubelet's part
	// sends during the flood, one every 100 ms.
	slowBodyProbes = 24
)

// TestFaultListenSlowBodies runs the proxy with an open file limit of
// listenFDLimit and has pod-c keep slowBodyClients connections to the
// node's health port, each sending `POST /livez` with a 200,000-byte
// Content-Length and then a byte every 100 ms, opening a new one whenever
// the proxy closes one. Meanwhile every one of slowBodyProbes probes of
// /livez from the node must get 200. Before the fix such a connection
// counted as busy while net/http read its body (up to the 10 s read
// timeout), the flood filled the cap, and the probes were closed unanswered
// (20 of 24 failed at 1,100 connections against the default cap of 1,024).
func TestFaultListenSlowBodies(t *testing.T) {
	t.Parallel()
	e := newFDLimitedEnv(t, listenFDLimit)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var n slowBodyCounts
	nodeHealth := hostPort(sandbox.NodeIPv4.Addr().String(), healthPort)
	for range slowBodyClients {
		go func() {
			for ctx.Err() == nil {
				slowBody(ctx, e.sb.NS(podC.Name), nodeHealth, &n)
			}
		}()
	}
	err := sandbox.Poll(ctx, 5*time.Second, 20*time.Millisecond, func(context.Context) error {
		if d := n.dialed.Load(); d < slowBodyClients {
			return fmt.Errorf("%d of %d slow-body connections opened", d, slowBodyClients)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the flood did not start: %v", err)
	}
	failed := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := range slowBodyProbes {
		<-tick.C
		code, _, err := e.health(t.Context(), "/livez")
		if err != nil || code != http.StatusOK {
			failed++
			t.Errorf("probe %d of /livez during the slow-body flood: %d, %v; want 200", i, code, err)
		}
	}
	t.Logf("slow-body flood of %d clients from %s to %s: %d connections opened, %d answered 413; %d of %d probes of /livez failed",
		slowBodyClients, podC.Name, nodeHealth, n.dialed.Load(), n.refused.Load(), failed, slowBodyProbes)
	e.proxy.checkRunning(t)
}

// slowBodyCounts are the slow-body connections opened and those answered
// 413.
type slowBodyCounts struct{ dialed, refused atomic.Int64 }

// slowBody opens one connection from namespace ns to addr, sends the
// headers of a POST of /livez with a 200,000-byte body and then a byte of
// it every 100 ms until the proxy closes the connection or ctx ends.
func slowBody(ctx context.Context, ns, addr string, n *slowBodyCounts) {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	c, err := dialInNetNS(dctx, ns, "tcp", addr)
	cancel()
	if err != nil {
		return
	}
	defer c.Close()
	n.dialed.Add(1)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	go func() {
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil && resp.StatusCode == http.StatusRequestEntityTooLarge {
			n.refused.Add(1)
		}
	}()
	if _, err := fmt.Fprintf(c, "POST /livez HTTP/1.1\r\nHost: %s\r\nContent-Length: 200000\r\n\r\n", addr); err != nil {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		<-tick.C
		if _, err := c.Write([]byte{'x'}); err != nil {
			return
		}
	}
}
