package dataplane

import (
	"context"
	"errors"
	"fmt"
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
)

const (
	server = "pod-a" // runs the echo servers behind the two real Services
	client = "pod-b" // the pod that connects
	// sampleTimeout bounds one sample: above TCP's first SYN retransmit
	// (1 s), so a lost SYN shows as a slow sample, not a failure.
	sampleTimeout = 3 * time.Second
)

// TestDataplaneSmoke programs 100 Services and checks that new TCP and UDP
// flows from a pod and from the node reach the real Service's endpoints
// through its ClusterIP (load-balanced, not masqueraded) and the pod
// directly, measuring a few samples of each on the way.
func TestDataplaneSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("kernel test: skipped in -short mode")
	}
	e := newEnv(t, 100)
	for _, from := range []string{client, sandbox.Node} {
		res, err := e.measure(from, 30)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res {
			if s.fails > 0 {
				t.Errorf("from %s, %s to %s: %d of %d samples failed, first: %v", from, s.proto, s.via, s.fails, s.fails+len(s.samples), s.firstErr)
			}
			if s.via == viaClusterIP && len(s.backends) < 2 {
				t.Errorf("from %s, %s to the ClusterIP: every sample went to %v, want them spread over the endpoints", from, s.proto, s.backends)
			}
			t.Logf("from %s, %s to %s: p50/p90/p99 %s us", from, s.proto, s.via, Summarise(s.samples))
		}
	}
}

// TestDataplaneLatency is `make bench-dataplane`: for each size of
// KNP_DATAPLANE_SIZES (default 100,1000,10000) a fresh sandbox with that
// many Services x 10 endpoints, KNP_DATAPLANE_SAMPLES (default 2000) new
// flows per series, one markdown table (also written to KNP_DATAPLANE_OUT).
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

	var table strings.Builder
	table.WriteString("| Services | from | proto | direct to pod p50 / p90 / p99 (us) | ClusterIP p50 / p90 / p99 (us) | ClusterIP - direct p50 (us) | full sync |\n")
	table.WriteString("| ---: | --- | --- | --- | --- | ---: | ---: |\n")
	for _, n := range sizes {
		t.Run(fmt.Sprintf("services=%d", n), func(t *testing.T) {
			e := newEnv(t, n)
			for _, from := range []string{client, sandbox.Node} {
				res, err := e.measure(from, samples)
				if err != nil {
					t.Fatal(err)
				}
				direct := map[string]Stats{}
				for _, s := range res {
					// A few timeouts on a busy machine are noise;
					// a broken path fails them all.
					if s.fails*100 > samples {
						t.Errorf("from %s, %s to %s: %d of %d samples failed, first: %v", from, s.proto, s.via, s.fails, samples, s.firstErr)
					}
					if s.via == viaDirect {
						direct[s.proto] = Summarise(s.samples)
					}
				}
				for _, s := range res {
					if s.via != viaClusterIP {
						continue
					}
					st, d := Summarise(s.samples), direct[s.proto]
					fmt.Fprintf(&table, "| %d | %s | %s | %s | %s | %s | %s |\n", n, from, s.proto, d, st,
						Micros(st.P50-d.P50), scale.Secs(e.sync.Seconds()))
				}
			}
		})
	}
	t.Logf("first-packet latency, %d new flows per series:\n%s", samples, table.String())
	if out := os.Getenv("KNP_DATAPLANE_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(table.String()), 0o644); err != nil {
			t.Errorf("KNP_DATAPLANE_OUT: %v", err)
		}
	}
}

// env is a sandbox whose node is programmed with n Services.
type env struct {
	t    testing.TB
	sb   *sandbox.Sandbox
	tg   Targets
	sync time.Duration // the full sync, transaction included
}

// newEnv builds the sandbox, starts the echo servers in pod-a, programs the
// node with n Services and waits until the TCP Service answers from pod-b.
// Everything is removed when the test ends.
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
	st, tg, err := State(n, pod.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	startEcho(t, nsPath(sb, server), pod.IPv4)

	// The node has no default route: without this one, its own
	// connections to a ClusterIP would fail before the output hook.
	if _, err := sb.Exec(ctx, sandbox.Node, "ip", "route", "add", sandbox.ServiceCIDRs[0].String(), "dev", sandbox.Bridge); err != nil {
		t.Fatal(err)
	}

	k, err := nft.OpenKernel(nsPath(sb, sandbox.Node))
	if err != nil {
		t.Fatalf("opening the node's nftables: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	cfg := nft.DefaultConfig()
	cfg.ClusterCIDRs = sandbox.ClusterCIDRs
	be, err := nft.NewBackend(cfg, k, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := be.Sync(ctx, st)
	if err != nil {
		t.Fatalf("syncing %d services: %v", n, err)
	}
	e := &env{t: t, sb: sb, tg: tg, sync: time.Since(start)}
	t.Logf("%d services x %d endpoints: full sync %v (kernel %v, %d messages)", n, Endpoints, e.sync.Round(time.Millisecond),
		res.Kernel.Round(time.Millisecond), res.Messages)

	err = sandbox.Poll(ctx, 10*time.Second, 20*time.Millisecond, func(context.Context) error {
		return inNetns(nsPath(sb, client), func() error {
			_, _, err := TCPConnect(tg.TCP, time.Second)
			return err
		})
	})
	if err != nil {
		t.Fatalf("the ClusterIP never answered: %v", err)
	}
	return e
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

// series is the samples of one protocol, one way, from one namespace.
type series struct {
	proto, via string
	samples    []time.Duration
	fails      int
	firstErr   error
	backends   map[string]int
}

// measure takes count samples of each series from namespace from (client
// or the node), interleaved, so that whatever else runs on the machine
// weighs on every series alike.
func (e *env) measure(from string, count int) ([]*series, error) {
	pod, _ := e.sb.Pod(server)
	src := sandbox.BridgeIPv4.Addr() // the node's address towards the pods
	if from != sandbox.Node {
		p, _ := e.sb.Pod(from)
		src = p.IPv4
	}
	all := make([]string, Endpoints)
	for j := range all {
		all[j] = BackendName(j)
	}
	direct := []string{BackendName(0)}
	type way struct {
		s      *series
		dst    netip.AddrPort
		wanted []string
		udp    bool
	}
	newWay := func(proto, via string, dst netip.AddrPort, wanted []string) way {
		return way{&series{proto: proto, via: via, backends: map[string]int{}}, dst, wanted, proto == "udp"}
	}
	podDst := netip.AddrPortFrom(pod.IPv4, BackendPort)
	ways := []way{
		newWay("tcp", viaDirect, podDst, direct),
		newWay("tcp", viaClusterIP, e.tg.TCP, all),
		newWay("udp", viaDirect, podDst, direct),
		newWay("udp", viaClusterIP, e.tg.UDP, all),
	}
	err := inNetns(nsPath(e.sb, from), func() error {
		for range count {
			for _, w := range ways {
				sample := TCPConnect
				if w.udp {
					sample = UDPRequest
				}
				d, r, err := sample(w.dst, sampleTimeout)
				if err == nil {
					err = Check(r, w.wanted, src, w.dst, w.udp)
				}
				if err != nil {
					if w.s.fails == 0 {
						w.s.firstErr = err
					}
					w.s.fails++
					continue
				}
				w.s.samples = append(w.s.samples, d)
				w.s.backends[r.Backend]++
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("measuring from %s: %w", from, err)
	}
	out := make([]*series, len(ways))
	for i, w := range ways {
		out[i] = w.s
	}
	return out, nil
}
