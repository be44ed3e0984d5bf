package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The client's pace and patience: a request every requestEvery per target
// and protocol, each given requestTimeout, so an outage shows as failures
// and as a gap between answers.
const (
	requestEvery   = 25 * time.Millisecond
	requestTimeout = time.Second
)

// target is one Service address the client pod sends requests to.
type target struct {
	name  string // "ClusterIP", "NodePort node1", ...
	proto string // "tcp" or "udp"
	addr  string // ip:port
}

// streamStats counts one target's requests.
type streamStats struct {
	target
	requests, failed int
	longestGap       time.Duration // between two answers (or the start and the first)
	gapEnd           time.Time     // when the longest gap ended
	lastOK           time.Time
	slowest          time.Duration // the slowest answered request
	slowestAt        time.Time     // when it ended
	firstErr         string
	failedAt         []time.Time // the first 20 failures' times
}

// record counts one request that took took and ended at end.
func (s *streamStats) record(err error, took time.Duration, end time.Time) {
	s.requests++
	if err != nil {
		s.failed++
		if s.firstErr == "" {
			s.firstErr = err.Error()
		}
		if len(s.failedAt) < 20 {
			s.failedAt = append(s.failedAt, end)
		}
		return
	}
	s.closeGap(end)
	s.lastOK = end
	if took > s.slowest {
		s.slowest, s.slowestAt = took, end
	}
}

func (s *streamStats) closeGap(end time.Time) {
	if gap := end.Sub(s.lastOK); gap > s.longestGap {
		s.longestGap, s.gapEnd = gap, end
	}
}

// traffic is a set of request streams sent from inside a pod's network
// namespace by this process: one goroutine per target, on an OS thread
// moved into that namespace, so every socket (a new one per request) is the
// pod's: its address, its route through the node's PREROUTING and FORWARD
// hooks, as any process in the pod would be.
type traffic struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	streams []*streamStats
	start   time.Time
}

// startTraffic starts a stream per target from the network namespace at
// netnsPath and returns once every stream's thread has entered it.
func startTraffic(ctx context.Context, netnsPath string, targets []target) (*traffic, error) {
	ctx, cancel := context.WithCancel(ctx)
	tr := &traffic{cancel: cancel, start: time.Now()}
	entered := make(chan error, len(targets))
	for _, tg := range targets {
		s := &streamStats{target: tg, lastOK: tr.start}
		tr.streams = append(tr.streams, s)
		tr.wg.Add(1)
		go tr.run(ctx, netnsPath, s, entered)
	}
	for range targets {
		if err := <-entered; err != nil {
			tr.stop()
			return nil, err
		}
	}
	return tr, nil
}

// run sends s's requests until ctx ends. Its thread is never unlocked: it
// has entered another network namespace, so the runtime ends it with the
// goroutine instead of reusing it.
func (tr *traffic) run(ctx context.Context, netnsPath string, s *streamStats, entered chan<- error) {
	defer tr.wg.Done()
	runtime.LockOSThread()
	if err := enterNetNS(netnsPath); err != nil {
		entered <- err
		return
	}
	entered <- nil
	tick := time.NewTicker(requestEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		begin := time.Now()
		err := request(s.target)
		end := time.Now()
		if ctx.Err() != nil {
			return // cut short by stop: not the Service's fault
		}
		tr.mu.Lock()
		s.record(err, end.Sub(begin), end)
		tr.mu.Unlock()
	}
}

func enterNetNS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", path, err)
	}
	return nil
}

// request makes one request on a new socket (so a new connection-tracking
// entry, which the Service rules must DNAT afresh): an HTTP GET /hostname
// to agnhost netexec over TCP, or its "hostname" command over UDP.
func request(tg target) error {
	deadline := time.Now().Add(requestTimeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial(tg.proto, tg.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if tg.proto == "udp" {
		if _, err := conn.Write([]byte("hostname")); err != nil {
			return err
		}
		buf := make([]byte, 256)
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("empty answer")
		}
		return nil
	}
	if _, err := io.WriteString(conn, "GET /hostname HTTP/1.0\r\n\r\n"); err != nil {
		return err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(b), "HTTP/1.") || !strings.Contains(strings.SplitN(string(b), "\n", 2)[0], " 200 ") {
		return fmt.Errorf("answer %.40q", b)
	}
	return nil
}

// stop ends the streams and returns their counts, the time since each
// stream's last answer counted as a gap too.
func (tr *traffic) stop() []streamStats {
	tr.cancel()
	tr.wg.Wait()
	end := time.Now()
	out := make([]streamStats, 0, len(tr.streams))
	for _, s := range tr.streams {
		s.closeGap(end)
		out = append(out, *s)
	}
	return out
}

// summary is the one line a fault prints: per target and protocol, the
// requests, the failures, the longest gap between answers and the slowest
// answer.
func summary(fault string, stats []streamStats) string {
	parts := make([]string, 0, len(stats))
	for _, s := range stats {
		parts = append(parts, fmt.Sprintf("%s %s %d requests %d failed, longest gap %v (slowest answer %v)",
			s.name, s.proto, s.requests, s.failed, s.longestGap.Round(time.Millisecond), s.slowest.Round(time.Millisecond)))
	}
	return fmt.Sprintf("FAULT %s: %s", fault, strings.Join(parts, "; "))
}

// failureDetails says, for each stream, when (wall clock) its longest gap
// and slowest answer ended, and for one that failed, its first error and
// when its failures were.
func failureDetails(stats []streamStats) []string {
	var out []string
	for _, s := range stats {
		if s.failed == 0 {
			out = append(out, fmt.Sprintf("%s %s: longest gap ended at %s, slowest answer at %s", s.name, s.proto,
				s.gapEnd.Format("15:04:05.000"), s.slowestAt.Format("15:04:05.000")))
			continue
		}
		at := make([]string, len(s.failedAt))
		for i, t := range s.failedAt {
			at[i] = t.Format("15:04:05.000")
		}
		out = append(out, fmt.Sprintf("%s %s: first error %q; failures at %s; longest gap ended at %s",
			s.name, s.proto, s.firstErr, strings.Join(at, " "), s.gapEnd.Format("15:04:05.000")))
	}
	return out
}
