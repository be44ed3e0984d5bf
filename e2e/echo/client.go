package echo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
)

// Limits that keep every client run bounded. MaxDuration leaves room for
// the flows of a long soak (make soak).
const (
	MaxCount    = 1_000_000
	MaxDuration = 24 * time.Hour
	MaxTimeout  = time.Minute
	MaxResults  = 10_000
)

// What ClientConfig.Results keeps.
const (
	ResultsNone   = "none"
	ResultsFailed = "failed"
	ResultsAll    = "all"
)

// ClientConfig describes a client run: Count requests (each a new TCP
// connection, or a new UDP socket), one after the other, Interval apart.
type ClientConfig struct {
	Network  string        // "tcp" or "udp"
	Addr     string        // host:port
	Count    int           // number of requests; 0 means as many as fit in Duration
	Timeout  time.Duration // per request
	Interval time.Duration // pause between requests
	Duration time.Duration // bound on the whole run; 0 means none beyond Count x Timeout
	SrcPort  int           // fixed source port (same 5-tuple, same conntrack entry); 0 means any
	SrcAddr  netip.Addr    // source address (one of the namespace's); invalid means the route's
	// UntilFail stops at the first failure, UntilOK at the first success.
	UntilFail, UntilOK bool
	Results            string // ResultsNone (default), ResultsFailed or ResultsAll
	// OnReply, if set, is called after each reply with the replies so far:
	// how a harness learns that a long run is under way.
	OnReply func(ok int) `json:"-"`
}

func (c *ClientConfig) validate() error {
	switch c.Network {
	case "tcp", "udp":
	default:
		return fmt.Errorf("network %q: want tcp or udp", c.Network)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("address %q: %w", c.Addr, err)
	}
	switch {
	case c.Count < 0 || c.Count > MaxCount:
		return fmt.Errorf("count %d: want 0..%d", c.Count, MaxCount)
	case c.Count == 0 && c.Duration <= 0:
		return errors.New("need a count, a duration or both")
	case c.Duration < 0 || c.Duration > MaxDuration:
		return fmt.Errorf("duration %v: want at most %v", c.Duration, MaxDuration)
	case c.Timeout <= 0 || c.Timeout > MaxTimeout:
		return fmt.Errorf("timeout %v: want more than 0, at most %v", c.Timeout, MaxTimeout)
	case c.Interval < 0 || c.Interval > MaxTimeout:
		return fmt.Errorf("interval %v: want 0..%v", c.Interval, MaxTimeout)
	case c.SrcPort < 0 || c.SrcPort > 65535:
		return fmt.Errorf("source port %d: want 0..65535", c.SrcPort)
	case c.UntilFail && c.UntilOK:
		return errors.New("until-fail and until-ok exclude each other")
	}
	switch c.Results {
	case "":
		c.Results = ResultsNone
	case ResultsNone, ResultsFailed, ResultsAll:
	default:
		return fmt.Errorf("results %q: want none, failed or all", c.Results)
	}
	return nil
}

// Summary is the outcome of a client run, printed as JSON by e2e-agent.
type Summary struct {
	Target  string         `json:"target"` // "tcp 10.96.0.10:80"
	OK      int            `json:"ok"`
	Failed  int            `json:"failed"`
	Backend map[string]int `json:"backends"` // server name -> replies
	// Sources counts the source addresses (without port) the servers
	// saw: the client's own address, or the node's if masqueraded.
	Sources map[string]int `json:"sources"`
	// Errors counts failures by kind: refused, timeout, reset,
	// unreachable, eof, bad-reply, other.
	Errors    map[string]int `json:"errors,omitempty"`
	ElapsedMS float64        `json:"elapsed_ms"`
	// LongestGapMS is the longest time without a reply: between two
	// successive replies, from the start to the first reply or from the
	// last reply to the end (the whole run when nothing answered).
	// LongestGapAtMS is when that gap began, since the run's start.
	LongestGapMS   float64  `json:"longest_gap_ms"`
	LongestGapAtMS float64  `json:"longest_gap_at_ms"`
	Results        []Result `json:"results,omitempty"`
	// Truncated says that Results stopped at MaxResults.
	Truncated bool `json:"results_truncated,omitempty"`
}

// Success reports whether the run went as hoped: no failure and at least one
// reply (with UntilOK: at least one reply).
func (s *Summary) Success(untilOK bool) bool {
	if untilOK {
		return s.OK > 0
	}
	return s.OK > 0 && s.Failed == 0
}

// Result is one request.
type Result struct {
	AtMS    float64 `json:"at_ms"` // start, since the run's start
	RTTMS   float64 `json:"rtt_ms"`
	Backend string  `json:"backend,omitempty"`
	Source  string  `json:"source,omitempty"` // as the server saw it, with port
	Error   string  `json:"error,omitempty"`
}

// Run sends the requests and returns the summary; the error is only for a
// bad configuration. Failed requests are counted, not returned. A request
// that the end of Duration (or of ctx) cuts short is not counted at all.
func Run(ctx context.Context, cfg ClientConfig) (*Summary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	sum := &Summary{
		Target:  cfg.Network + " " + cfg.Addr,
		Backend: map[string]int{},
		Sources: map[string]int{},
	}
	start := time.Now()
	lastOK := start // the last reply, or the start
	gap := func(now time.Time) {
		if d := ms(now.Sub(lastOK)); d > sum.LongestGapMS {
			sum.LongestGapMS, sum.LongestGapAtMS = d, ms(lastOK.Sub(start))
		}
	}
	defer func() {
		now := time.Now()
		gap(now)
		sum.ElapsedMS = ms(now.Sub(start))
	}()
	// ctx.Err() turns non-nil a little after the deadline passes; dials
	// fail at once in between.
	ended := func() bool {
		dl, ok := ctx.Deadline()
		return ctx.Err() != nil || ok && !time.Now().Before(dl)
	}
	for i := 0; cfg.Count == 0 || i < cfg.Count; i++ {
		if i > 0 && cfg.Interval > 0 {
			t := time.NewTimer(cfg.Interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return sum, nil
			case <-t.C:
			}
		}
		if ended() {
			break
		}
		t0 := time.Now()
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		reply, err := request(rctx, cfg)
		cancel()
		if err != nil && ended() && time.Since(t0) < cfg.Timeout {
			// The run's Duration cut this request short: not a
			// failure of the path under test.
			break
		}
		r := Result{AtMS: ms(t0.Sub(start)), RTTMS: ms(time.Since(t0))}
		if err == nil {
			name, src, perr := ParseReply(reply)
			if perr != nil {
				err = perr
			} else {
				r.Backend, r.Source = name, src.String()
				now := time.Now()
				gap(now)
				lastOK = now
				sum.OK++
				sum.Backend[name]++
				sum.Sources[src.Addr().String()]++
				if cfg.OnReply != nil {
					cfg.OnReply(sum.OK)
				}
			}
		}
		if err != nil {
			r.Error = err.Error()
			sum.Failed++
			if sum.Errors == nil {
				sum.Errors = map[string]int{}
			}
			sum.Errors[errorKind(err)]++
		}
		if cfg.Results == ResultsAll || cfg.Results == ResultsFailed && err != nil {
			if len(sum.Results) < MaxResults {
				sum.Results = append(sum.Results, r)
			} else {
				sum.Truncated = true
			}
		}
		if cfg.UntilFail && err != nil || cfg.UntilOK && err == nil {
			break
		}
	}
	return sum, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// request does one request within ctx and returns the reply line.
func request(ctx context.Context, cfg ClientConfig) (string, error) {
	d := net.Dialer{}
	if cfg.SrcPort != 0 || cfg.SrcAddr.IsValid() {
		if cfg.SrcPort != 0 {
			d.Control = reuseAddr
		}
		var ip net.IP
		if cfg.SrcAddr.IsValid() {
			ip = cfg.SrcAddr.AsSlice()
		}
		if cfg.Network == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: ip, Port: cfg.SrcPort}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: ip, Port: cfg.SrcPort}
		}
	}
	var (
		c   net.Conn
		err error
	)
	for {
		c, err = d.DialContext(ctx, cfg.Network, cfg.Addr)
		// With a fixed source port the previous connection may not
		// have let go of its 4-tuple yet (LAST_ACK): retry shortly.
		if err == nil || cfg.SrcPort == 0 || !(errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL)) {
			break
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", err
	}
	if cfg.Network == "udp" {
		buf := make([]byte, 2048)
		n, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	// TCP: one line, then the server closes.
	line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
	if err != nil {
		if err == io.EOF {
			return "", io.ErrUnexpectedEOF
		}
		return "", err
	}
	return line, nil
}

func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// errorKind classifies a failed request.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return "prohibited"
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "eof"
	case errors.Is(err, ErrBadReply):
		return "bad-reply"
	}
	return "other"
}
