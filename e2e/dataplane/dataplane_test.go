package dataplane

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"golang.org/x/sys/unix"
)

const (
	server = "pod-a" // runs the echo servers behind the two real Services
	client = "pod-b" // the pod that connects
	// sampleTimeout bounds one sample: above TCP's first SYN retransmit
	// (1 s), so a lost SYN shows as a slow sample, not a failure.
	sampleTimeout = 3 * time.Second
)

// TestDataplaneSmoke programs 100 Services and checks that new TCP and UDP
// flows from a pod and from the node reach the real Services' endpoints
// through their ClusterIPs (load-balanced, not masqueraded) and the pod
// directly, measuring a few samples of each on the way.
func TestDataplaneSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("kernel test: skipped in -short mode")
	}
	res, err := measure([]*env{newEnv(t, 100)}, 30)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res {
		if s.fails > 0 {
			t.Errorf("%v: %d of %d samples failed, first: %v", s, s.fails, s.fails+len(s.samples), s.firstErr)
		}
		if s.via == viaClusterIP && len(s.backends) < 2 {
			t.Errorf("%v: every sample went to %v, want them spread over the endpoints", s, s.backends)
		}
		t.Logf("%v: p50/p90/p99 %s us", s, Summarise(s.samples))
	}
}

// TestDataplaneLatency is `make bench-dataplane`: a sandbox per size of
// KNP_DATAPLANE_SIZES (default 100,1000,10000) with that many Services x 10
// endpoints, and one with no ruleset at all (no conntrack either: the cost
// of having a proxy), all alive at once, KNP_DATAPLANE_SAMPLES (default
// 2000) new flows per series, one markdown table (also written to
// KNP_DATAPLANE_OUT).
func TestDataplaneLatency(t *testing.T) {
	if os.Getenv("KNP_DATAPLANE_BENCH") != "1" {
		t.Skip("the data-plane latency benchmark runs with KNP_DATAPLANE_BENCH=1 (make bench-dataplane)")
	}
	spec := os.Getenv("KNP_DATAPLANE_SIZES")
	if spec == "" {
		spec = "100,1000,10000"
	}
	sizes, err := scale.Sizes(spec)
	if err != nil {
		t.Fatalf("KNP_DATAPLANE_SIZES: %v", err)
	}
	samples := 2000
	if s := os.Getenv("KNP_DATAPLANE_SAMPLES"); s != "" {
		if samples, err = strconv.Atoi(s); err != nil || samples < 10 {
			t.Fatalf("KNP_DATAPLANE_SAMPLES=%q: want a number >= 10", s)
		}
	}
	var envs []*env
	syncs := map[int]time.Duration{}
	for _, n := range append([]int{0}, sizes...) {
		e := newEnv(t, n)
		envs = append(envs, e)
		syncs[n] = e.sync
	}
	res, err := measure(envs, samples)
	if err != nil {
		t.Fatal(err)
	}

	var table strings.Builder
	table.WriteString("| Services | from | proto | direct to pod p50 / p90 / p99 (us) | ClusterIP p50 / p90 / p99 (us) | ClusterIP - direct p50 (us) | full sync |\n")
	table.WriteString("| ---: | --- | --- | --- | --- | ---: | ---: |\n")
	direct := map[[3]any]Stats{}
	for _, s := range res {
		// A few timeouts on a busy machine are noise; a broken path
		// fails them all.
		if s.fails*100 > samples {
			t.Errorf("%v: %d of %d samples failed, first: %v", s, s.fails, samples, s.firstErr)
		}
		if s.via == viaDirect {
			direct[[3]any{s.n, s.from, s.proto}] = Summarise(s.samples)
		}
	}
	for _, s := range res {
		switch {
		case s.n == 0:
			fmt.Fprintf(&table, "| none (no ruleset) | %s | %s | %s | - | - | - |\n", s.from, s.proto, Summarise(s.samples))
		case s.via == viaClusterIP:
			st, d := Summarise(s.samples), direct[[3]any{s.n, s.from, s.proto}]
			fmt.Fprintf(&table, "| %d | %s | %s | %s | %s | %s | %s |\n", s.n, s.from, s.proto, d, st,
				Micros(st.P50-d.P50), scale.Secs(syncs[s.n].Seconds()))
		}
	}
	t.Logf("first-packet latency, %d new flows per series:\n%s", samples, table.String())
	if out := os.Getenv("KNP_DATAPLANE_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(table.String()), 0o644); err != nil {
			t.Errorf("KNP_DATAPLANE_OUT: %v", err)
		}
	}
}

// env is a sandbox whose node is programmed with n Services (0: not at all).
type env struct {
	n    int
	sb   *sandbox.Sandbox
	tg   Targets
	sync time.Duration // the full sync, transaction included
}

// newEnv builds the sandbox, starts the echo servers in pod-a, programs the
// node with n Services (none and no nftables at all for 0) and waits until
// the TCP Service (for 0: the pod) answers from pod-b. Everything is
// removed when the test ends.
func newEnv(t testing.TB, n int) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	pod, _ := sb.Pod(server)
	startEcho(t, nsPath(sb, server), pod.IPv4)
	e := &env{n: n, sb: sb}
	if n > 0 {
		e.program(t)
	}
	dst := e.tg.TCP
	if n == 0 {
		dst = netip.AddrPortFrom(pod.IPv4, BackendPort)
	}
	err = sandbox.Poll(ctx, 10*time.Second, 20*time.Millisecond, func(context.Context) error {
		return inNetns(nsPath(sb, client), func() error {
			_, _, err := TCPConnect(dst, time.Second)
			return err
		})
	})
	if err != nil {
		t.Fatalf("%v never answered: %v", dst, err)
	}
	return e
}

// program syncs e.n Services into the node namespace.
func (e *env) program(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	pod, _ := e.sb.Pod(server)
	st, tg, err := State(e.n, pod.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	e.tg = tg

	// The node has no default route: without this one, its own
	// connections to a ClusterIP would fail before the output hook.
	if _, err := e.sb.Exec(ctx, sandbox.Node, "ip", "route", "add", sandbox.ServiceCIDRs[0].String(), "dev", sandbox.Bridge); err != nil {
		t.Fatal(err)
	}

	k, err := nftlib.OpenKernel(nsPath(e.sb, sandbox.Node))
	if err != nil {
		t.Fatalf("opening the node's nftables: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	cfg := nft.DefaultConfig()
	cfg.ClusterCIDRs = sandbox.ClusterCIDRs
	be, err := nft.NewBackend(k, nft.BackendConfig{Rules: cfg})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := be.Sync(ctx, st)
	if err != nil {
		t.Fatalf("syncing %d services: %v", e.n, err)
	}
	e.sync = time.Since(start)
	t.Logf("%d services x %d endpoints: full sync %v (kernel %v, %d messages)", e.n, Endpoints, e.sync.Round(time.Millisecond),
		res.Kernel.Round(time.Millisecond), res.Messages)
}

func nsPath(sb *sandbox.Sandbox, name string) string { return "/run/netns/" + sb.NS(name) }

// inNetns runs fn on a fresh goroutine inside the network namespace at
// path: if the thread cannot switch back, netns.Do ends that goroutine,
// not the caller's.
func inNetns(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		returned := false
		// Runs on netns.Do's runtime.Goexit too: never leave the caller waiting.
		defer func() {
			if !returned {
				done <- errors.New("could not leave network namespace " + path)
			}
		}()
		err := netns.Do(path, fn)
		returned = true
		done <- err
	}()
	return <-done
}

// startEcho runs one echo server per endpoint port on addr, in the network
// namespace at path, until the test ends.
func startEcho(t testing.TB, path string, addr netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for j := range Endpoints {
		hostPort := netip.AddrPortFrom(addr, uint16(BackendPort+j)).String()
		var s *echo.Server
		err := inNetns(path, func() error {
			var err error
			s, err = echo.Listen(BackendName(j), hostPort, hostPort)
			return err
		})
		if err != nil {
			t.Fatalf("echo server: %v", err)
		}
		s.Logf = t.Logf
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Serve(ctx); err != nil {
				t.Errorf("echo server %s: %v", s.Name, err)
			}
		}()
	}
}

// How a series reaches the echo servers.
const (
	viaClusterIP = "ClusterIP"
	viaDirect    = "pod IP"
)

// series is the samples of one protocol, one way, from one namespace of
// one sandbox.
type series struct {
	n          int    // Services programmed
	from       string // client or the node
	proto, via string
	samples    []time.Duration
	fails      int
	firstErr   error
	backends   map[string]int
}

func (s *series) String() string {
	return fmt.Sprintf("%d services, from %s, %s to %s", s.n, s.from, s.proto, s.via)
}

// probe is how one series takes a sample.
type probe struct {
	s   *series
	ns  *os.File       // the network namespace the flows start in
	src netip.Addr     // the address the servers must see
	dst netip.AddrPort // the ClusterIP; invalid: the pod, port by port
	pod netip.Addr
}

// measure takes rounds samples of every series of every sandbox: from the
// client pod and from the node, TCP and UDP, to the ClusterIP and to the
// pod. Each round takes one sample of each series, in a new random order,
// on one OS thread that enters the series' namespace before each sample:
// whatever else runs on the machine weighs on every series and every size
// alike, and no series always follows the same one.
func measure(envs []*env, rounds int) ([]*series, error) {
	var probes []probe
	for _, e := range envs {
		pod, _ := e.sb.Pod(server)
		for _, from := range []string{client, sandbox.Node} {
			src := sandbox.BridgeIPv4.Addr() // the node's address towards the pods
			if from != sandbox.Node {
				p, _ := e.sb.Pod(from)
				src = p.IPv4
			}
			f, err := os.Open(nsPath(e.sb, from))
			if err != nil {
				return nil, fmt.Errorf("network namespace: %w", err)
			}
			defer f.Close()
			for _, w := range []struct {
				proto, via string
				dst        netip.AddrPort
			}{
				{"tcp", viaDirect, netip.AddrPort{}},
				{"tcp", viaClusterIP, e.tg.TCP},
				{"udp", viaDirect, netip.AddrPort{}},
				{"udp", viaClusterIP, e.tg.UDP},
			} {
				if e.n == 0 && w.via == viaClusterIP {
					continue
				}
				s := &series{n: e.n, from: from, proto: w.proto, via: w.via, backends: map[string]int{}}
				probes = append(probes, probe{s: s, ns: f, src: src, dst: w.dst, pod: pod.IPv4})
			}
		}
	}
	all := make([]string, Endpoints)
	for j := range all {
		all[j] = BackendName(j)
	}
	// netns.Do (under inNetns) locks the thread and brings it back to the
	// test's namespace at the end, whichever namespaces fn entered.
	err := inNetns(nsPath(envs[0].sb, client), func() error {
		for i := range rounds {
			for _, k := range rand.Perm(len(probes)) {
				p := probes[k]
				if err := unix.Setns(int(p.ns.Fd()), unix.CLONE_NEWNET); err != nil {
					return fmt.Errorf("entering the namespace of %v: %w", p.s, err)
				}
				dst, wanted := p.dst, all
				if !dst.IsValid() { // round the servers as the ClusterIP does
					j := i % Endpoints
					dst, wanted = netip.AddrPortFrom(p.pod, uint16(BackendPort+j)), all[j:j+1]
				}
				udp := p.s.proto == "udp"
				sample := TCPConnect
				if udp {
					sample = UDPRequest
				}
				d, r, err := sample(dst, sampleTimeout)
				if err == nil {
					err = Check(r, wanted, p.src, dst, udp)
				}
				if err != nil {
					if p.s.fails == 0 {
						p.s.firstErr = err
					}
					p.s.fails++
					continue
				}
				p.s.samples = append(p.s.samples, d)
				p.s.backends[r.Backend]++
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("measuring: %w", err)
	}
	out := make([]*series, len(probes))
	for i, p := range probes {
		out[i] = p.s
	}
	return out, nil
}
