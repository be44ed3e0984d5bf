package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"
)

// A long-lived flow is one connection (or one UDP 5-tuple) opened when the
// workloads are up and held across every fault of a run, exchanging a
// request and its answer every flowEvery: what a database session, a gRPC
// stream or a media stream sees. The rules only decide where a flow's first
// packet goes; after that conntrack carries it, so a flow breaks only when
// something deletes its conntrack entry, drops its packets or moves it to
// another endpoint.
const (
	flowEvery = 50 * time.Millisecond
	// flowTCPTimeout is how long a TCP exchange may take before the
	// connection counts as broken: longer than any stall a loaded machine
	// gives, so a slow answer shows as a stall, not a break.
	flowTCPTimeout = 5 * time.Second
	// flowUDPTimeout is how long a datagram's answer is awaited; a late one
	// answers the next request (the same text), so it is a stall.
	flowUDPTimeout = time.Second
)

// flowTarget is where a long-lived flow goes, and the network namespace
// (a pod's, or the node network's: outside the cluster) it starts from.
type flowTarget struct {
	name  string // "pod → ClusterIP", ...
	proto string // "tcp" or "udp"
	addr  string // ip:port
	netns string // path
}

// flowCounts are one flow's exchanges over a window (one fault) or a run.
type flowCounts struct {
	exchanges, failed int
	// broken counts TCP connections that failed (reset, closed, or no answer
	// within flowTCPTimeout) and UDP flows answered by another endpoint.
	broken       int
	longestStall time.Duration // between two answers
	firstErr     string
}

func (c *flowCounts) fail(err error, broke bool) {
	c.failed++
	if broke {
		c.broken++
	}
	if c.firstErr == "" {
		c.firstErr = err.Error()
	}
}

func (c *flowCounts) stall(d time.Duration) {
	if d > c.longestStall {
		c.longestStall = d
	}
}

// flow is one long-lived flow's state, shared by its goroutine and the
// test that reads its windows.
type flow struct {
	flowTarget
	mu      sync.Mutex
	window  flowCounts // since the last look
	total   flowCounts // since the start
	lastOK  time.Time
	backend string // the endpoint's hostname, learnt from the first answer
}

// record counts one exchange that ended at now with answer (the backend's
// hostname) or err, and reports whether the TCP connection must be
// re-opened.
func (f *flow) record(answer string, err error, now time.Time) (reopen bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range []*flowCounts{&f.window, &f.total} {
		c.exchanges++
	}
	if err != nil {
		broke := f.proto == "tcp"
		f.window.fail(err, broke)
		f.total.fail(err, broke)
		if broke {
			f.backend = "" // a new connection may go to any endpoint
		}
		return broke
	}
	if f.backend != "" && answer != f.backend {
		moved := fmt.Errorf("answered by %s, then by %s", f.backend, answer)
		f.window.fail(moved, true)
		f.total.fail(moved, true)
	}
	f.backend = answer
	f.window.stall(now.Sub(f.lastOK))
	f.total.stall(now.Sub(f.lastOK))
	f.lastOK = now
	return false
}

// look returns the window's counts, the time since the last answer counted
// as a stall, and starts a new window.
func (f *flow) look(now time.Time) flowCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.window.stall(now.Sub(f.lastOK))
	f.total.stall(now.Sub(f.lastOK))
	w := f.window
	f.window = flowCounts{}
	return w
}

// flows are the run's long-lived flows, each on its own OS thread moved
// into its namespace (as traffic's streams are).
type flows struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	all    []*flow
}

// openFlows opens every flow and returns once each has had its first
// answer, or the error of the first that could not.
func openFlows(ctx context.Context, targets []flowTarget) (*flows, error) {
	ctx, cancel := context.WithCancel(ctx)
	fs := &flows{cancel: cancel}
	ready := make(chan error, len(targets))
	for _, tg := range targets {
		f := &flow{flowTarget: tg, lastOK: time.Now()}
		fs.all = append(fs.all, f)
		fs.wg.Add(1)
		go fs.run(ctx, f, ready)
	}
	for range targets {
		if err := <-ready; err != nil {
			fs.close()
			return nil, err
		}
	}
	return fs, nil
}

// run keeps f's exchanges going until ctx ends. Its thread is never
// unlocked: it has entered another network namespace.
func (fs *flows) run(ctx context.Context, f *flow, ready chan<- error) {
	defer fs.wg.Done()
	runtime.LockOSThread()
	if err := enterNetNS(f.netns); err != nil {
		ready <- err
		return
	}
	c, err := dialFlow(f.flowTarget)
	if err == nil {
		var answer string
		answer, err = c.exchange()
		f.record(answer, err, time.Now())
	}
	if err != nil {
		ready <- fmt.Errorf("flow %s %s to %s: %w", f.name, f.proto, f.addr, err)
		return
	}
	ready <- nil
	defer func() { c.close() }()
	tick := time.NewTicker(flowEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if c == nil {
			if c, err = dialFlow(f.flowTarget); err != nil {
				f.record("", fmt.Errorf("reconnect: %w", err), time.Now())
				continue
			}
		}
		answer, err := c.exchange()
		if ctx.Err() != nil {
			return // cut short by close: not the Service's fault
		}
		if f.record(answer, err, time.Now()) {
			c.close()
			c = nil
		}
	}
}

// close ends every flow.
func (fs *flows) close() {
	fs.cancel()
	fs.wg.Wait()
}

// look returns each flow's counts since the last look.
func (fs *flows) look() []flowResult {
	now := time.Now()
	out := make([]flowResult, 0, len(fs.all))
	for _, f := range fs.all {
		out = append(out, flowResult{f.flowTarget, f.look(now)})
	}
	return out
}

// totals returns each flow's counts since it was opened.
func (fs *flows) totals() []flowResult {
	out := make([]flowResult, 0, len(fs.all))
	for _, f := range fs.all {
		f.mu.Lock()
		out = append(out, flowResult{f.flowTarget, f.total})
		f.mu.Unlock()
	}
	return out
}

// flowResult is one flow's counts.
type flowResult struct {
	flowTarget
	flowCounts
}

// flowSummary is the FLOWS line of a fault: per flow, its exchanges, how
// many failed, how many times it broke, and its longest stall.
func flowSummary(fault string, rs []flowResult) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %s %d exchanges %d failed %d broken, longest stall %v",
			r.name, r.proto, r.exchanges, r.failed, r.broken, r.longestStall.Round(time.Millisecond)))
	}
	return fmt.Sprintf("FLOWS %s: %s", fault, strings.Join(parts, "; "))
}

// flowConn is a long-lived flow's socket.
type flowConn struct {
	conn  net.Conn
	proto string
	br    *bufio.Reader
}

func dialFlow(tg flowTarget) (*flowConn, error) {
	timeout := flowUDPTimeout
	if tg.proto == "tcp" {
		timeout = flowTCPTimeout
	}
	conn, err := net.DialTimeout(tg.proto, tg.addr, timeout)
	if err != nil {
		return nil, err
	}
	return &flowConn{conn: conn, proto: tg.proto, br: bufio.NewReader(conn)}, nil
}

func (c *flowConn) close() {
	if c != nil {
		c.conn.Close()
	}
}

// exchange asks the agnhost netexec endpoint for its hostname: over TCP an
// HTTP/1.1 request on the kept-alive connection, over UDP its "hostname"
// command from the same socket.
func (c *flowConn) exchange() (string, error) {
	if c.proto == "udp" {
		if err := c.conn.SetDeadline(time.Now().Add(flowUDPTimeout)); err != nil {
			return "", err
		}
		if _, err := c.conn.Write([]byte("hostname")); err != nil {
			return "", err
		}
		buf := make([]byte, 256)
		n, err := c.conn.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:n])), nil
	}
	if err := c.conn.SetDeadline(time.Now().Add(flowTCPTimeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c.conn, "GET /hostname HTTP/1.1\r\nHost: echo\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || resp.Close {
		return "", fmt.Errorf("answer %q (close %v)", resp.Status, resp.Close)
	}
	return strings.TrimSpace(string(body)), nil
}
