package apisource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/connrotation"
)

// APIClient is a clientset whose connections an APISource can close (a
// watch on a hung or blackholed API server otherwise waits for TCP or
// HTTP/2 timeouts of a minute or more) and whose requests it can hold back
// while the server is known to be away. Without the hold, each informer
// meets "connection refused" and backs off exponentially, up to a minute
// with jitter, so that it may resume watching long after the server is
// back; held requests are sent as soon as a probe gets an answer.
type APIClient struct {
	kubernetes.Interface
	gate   *requestGate
	dialer *connrotation.Dialer
}

// NewAPIClient builds the clientset of rc with tracked connections and the
// request gate (rc is copied, not changed).
func NewAPIClient(rc *rest.Config) (*APIClient, error) {
	rc = rest.CopyConfig(rc)
	// As client-go's default dialer, with every connection tracked.
	dialer := connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	rc.Dial = dialer.DialContext
	gate := newRequestGate()
	rc.Wrap(gate.wrap)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return &APIClient{Interface: client, gate: gate, dialer: dialer}, nil
}

// probeKey marks the context of a probe: the gate lets it through.
type probeKey struct{}

// requestGate holds back GET requests (lists and watches) while the API
// server is known to be away, and holds back again, rather than fail, a
// GET whose connection could not be opened: nothing was sent, so sending
// it again once the server answers is safe. Probes pass through.
type requestGate struct {
	mu     sync.Mutex
	open   chan struct{} // closed while requests may go
	closed bool
	// suspect, when set, is told of a connection that could not be
	// opened (the watchdog probes at once).
	suspect func(error)
	// refused: the last answer to a list or watch was a refusal (401,
	// 403) or a server error; the server answering probes is not
	// enough then to say that the source reads fine.
	refused bool
}

func newRequestGate() *requestGate {
	g := &requestGate{open: make(chan struct{})}
	close(g.open)
	return g
}

// hold makes requests wait until release.
func (g *requestGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed, g.open = true, make(chan struct{})
	}
}

// release lets held and new requests go.
func (g *requestGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
	}
}

// wait returns when requests may go, or with ctx's error.
func (g *requestGate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchedBy makes a connection that could not be opened hold requests
// back and tell suspect; without it (no watchdog to release them), the
// error goes to the caller.
func (g *requestGate) watchedBy(suspect func(error)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.suspect = suspect
}

func (g *requestGate) suspecter() func(error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.suspect
}

// answered records the status code of an answer to a list or watch.
func (g *requestGate) answered(code int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case code < 300:
		g.refused = false
	case code == http.StatusUnauthorized || code == http.StatusForbidden || code >= 500:
		g.refused = true
	}
}

// isRefused reports whether the last answer to a list or watch refused it.
func (g *requestGate) isRefused() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}

// isHeld reports whether requests are held back now.
func (g *requestGate) isHeld() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

func (g *requestGate) wrap(next http.RoundTripper) http.RoundTripper {
	return gatedTransport{gate: g, next: next}
}

type gatedTransport struct {
	gate *requestGate
	next http.RoundTripper
}

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if ctx.Value(probeKey{}) != nil || req.Method != http.MethodGet || req.Body != nil && req.Body != http.NoBody {
		return t.next.RoundTrip(req)
	}
	for {
		if err := t.gate.wait(ctx); err != nil {
			return nil, err
		}
		resp, err := t.next.RoundTrip(req)
		if err == nil {
			t.gate.answered(resp.StatusCode)
		}
		suspect := t.gate.suspecter()
		if err == nil || suspect == nil || !isDialError(err) || ctx.Err() != nil {
			return resp, err
		}
		t.gate.hold()
		suspect(err)
	}
}

// isDialError reports whether err is a failure to open a connection (refused,
// unreachable, timed out): the request was not sent.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
