package nftbench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
)

// latencyResult is one proxy kind's run of the network programming
// latency benchmark: N proxies of that kind, each in its own node
// namespace, and a window of changes at a fixed rate.
type latencyResult struct {
	Proxy              string
	Nodes, Synced      int // asked for; past their first sync
	Services           int // at the window's start
	Rate               float64
	Window             time.Duration
	Changes            int // written (endpoint changes and Services created)
	Skipped, WriteErrs int
	// Latencies: for every node and change, the time from just before the
	// API write to the change's address read back from that node's kernel.
	Latencies []time.Duration
	// Writes: each change's API write, from just before it to its answer.
	Writes []time.Duration
	// NotSeen: node x change pairs never seen within the drain; Lost:
	// those whose notification the kernel may have dropped (ENOBUFS),
	// of which LostHeld were in the ruleset at the end.
	NotSeen, Lost, LostHeld, Overruns int
	// Programming: the proxies' kubeproxy_network_programming_duration_seconds
	// observations over the window, merged across nodes.
	Programming scale.Buckets
	// APICPU: kube-apiserver's user+system seconds over the window;
	// APIBytes: bytes received by the nodes' veths from it.
	APICPU   float64
	APIBytes int64
	// StartAPICPU and StartBytes are the same from the first start to the
	// window (the first lists and watches of every node, and the settle).
	StartAPICPU float64
	StartBytes  int64
	Load        string
	// StartToSynced is the time from the first start to the last first
	// sync (or to giving up, when Synced < Nodes: nothing else measured).
	StartToSynced time.Duration
}

// latencySettings are make bench-latency's parameters.
type latencySettings struct {
	nodes, services int
	rate            float64
	window, bound   time.Duration
	kinds           []string
}

// Starting proxies: at most maxStarting before their first sync at once,
// and none while the machine has less than minMemAvailable free (50 of
// upstream's first syncs at once need more memory than the machine has).
const (
	maxStarting     = 4
	minMemAvailable = 3 << 30
	// settleLatency is let pass after the last first sync, before the
	// window: the proxies' follow-up syncs (upstream's IPv6 proxier, ours'
	// release of the first sync's rules) are not the workload's.
	settleLatency = 10 * time.Second
	// drainLatency bounds the wait, after the last write, for every node to
	// show every change.
	drainLatency = 60 * time.Second
)

// startNodes starts n proxies of kind, each in node namespace i, and
// waits for their first syncs (each for bound at most).
func (b *bench) startNodes(kind string, n int, bound time.Duration) ([]*idleProxy, error) {
	ctx := b.t.Context()
	var ps []*idleProxy
	t0 := time.Now()
	for i := range n {
		for {
			pending, err := checkSynced(ctx, b.t, ps, bound)
			if err != nil {
				return ps, err
			}
			if pending < maxStarting && memAvailable() >= minMemAvailable {
				break
			}
			if time.Since(t0) > bound {
				b.t.Logf("%s: started %d of %d nodes within %v", kind, len(ps), n, bound)
				return ps, nil
			}
			if err := pause(ctx, 200*time.Millisecond); err != nil {
				return ps, err
			}
		}
		ip, err := b.startIdle(kind, i)
		if err != nil {
			return ps, err
		}
		ps = append(ps, ip)
	}
	return ps, waitSynced(ctx, b.t, ps, bound)
}

// measureLatency runs the benchmark for kind: its proxies started and
// synced, the window of changes, the drain, and their cost.
func (b *bench) measureLatency(w *workload, kind string, s latencySettings) (r latencyResult, err error) {
	r = latencyResult{Proxy: kind, Nodes: s.nodes, Services: b.created + w.created, Rate: s.rate}
	t0 := time.Now()
	initial, err := b.costs(b.t.Context(), nil, false)
	if err != nil {
		return r, err
	}
	ps, err := b.startNodes(kind, s.nodes, s.bound)
	defer stopAll(ps)
	if err != nil {
		return r, err
	}
	r.StartToSynced = time.Since(t0)
	for _, ip := range ps {
		if ip.synced {
			r.Synced++
		}
	}
	if r.Synced < s.nodes {
		r.Load = loadAverage()
		return r, nil
	}
	b.t.Logf("%s: %d nodes synced in %v; settling %v", kind, r.Synced, r.StartToSynced.Round(time.Second), settleLatency)
	ctx := b.t.Context()
	if err := pause(ctx, settleLatency); err != nil {
		return r, err
	}
	want := newAwaited()
	ws := make([]*kernelWatch, 0, len(ps))
	defer func() {
		for _, kw := range ws {
			if cerr := kw.close(); cerr != nil && err == nil {
				err = fmt.Errorf("the kernel watch of %s: %w", kw.ns, cerr)
			}
		}
	}()
	for _, ip := range ps {
		kw, err := watchKernel(ip.ns, want)
		if err != nil {
			return r, err
		}
		ws = append(ws, kw)
	}
	before, err := b.costs(ctx, ps, false)
	if err != nil {
		return r, err
	}
	start := time.Now()
	w.run(ctx, want, s.rate, s.window)
	r.Window = time.Since(start)
	changes := want.snapshot()
	drained := drain(ctx, ws, changes)
	after, err := b.costs(ctx, ps, true)
	if err != nil {
		return r, err
	}
	b.t.Logf("%s: window %v, drained in %v", kind, r.Window.Round(time.Millisecond), drained.Round(time.Millisecond))
	r.Load = loadAverage()
	r.APICPU, r.APIBytes = after.apiCPU-before.apiCPU, after.bytes-before.bytes
	r.StartAPICPU, r.StartBytes = before.apiCPU-initial.apiCPU, before.bytes
	r.Programming = after.programming.Minus(before.programming)
	skipped, errs := w.outcome()
	r.Skipped, r.WriteErrs = skipped, len(errs)
	for _, e := range errs {
		b.t.Errorf("%s: %v", kind, e)
	}
	return r, r.tally(ws, changes)
}

// tally fills the latencies and the unseen from the watches, checking the
// ruleset for the changes whose notification may have been dropped.
func (r *latencyResult) tally(ws []*kernelWatch, changes []change) error {
	for _, c := range changes {
		if !c.failed {
			r.Changes++
			r.Writes = append(r.Writes, c.done.Sub(c.at))
		}
	}
	slices.Sort(r.Writes)
	for _, kw := range ws {
		kw.mu.Lock()
		lost := map[[4]byte]bool{}
		for i, c := range changes {
			seen, ok := kw.seen[i]
			switch {
			case c.failed:
			case kw.lost[i]:
				lost[c.ip] = true
			case ok:
				r.Latencies = append(r.Latencies, seen.Sub(c.at))
			default:
				r.NotSeen++
			}
		}
		r.Overruns += kw.overruns
		kw.mu.Unlock()
		if len(lost) == 0 {
			continue
		}
		held, err := kernelHolds(kw.ns, lost)
		if err != nil {
			return err
		}
		r.Lost += len(lost)
		r.LostHeld += len(held)
	}
	slices.Sort(r.Latencies)
	return nil
}

// drain waits until every node has seen (or lost) every change, for
// drainLatency at most, and returns how long it waited.
func drain(ctx context.Context, ws []*kernelWatch, changes []change) time.Duration {
	t0 := time.Now()
	for time.Since(t0) < drainLatency {
		missing := 0
		for _, kw := range ws {
			missing += kw.missing(changes)
		}
		if missing == 0 || pause(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return time.Since(t0)
}

func stopAll(ps []*idleProxy) {
	var wg sync.WaitGroup
	for _, ip := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); ip.close() }()
	}
	wg.Wait()
}

// costs is what the window is measured by at one moment.
type costs struct {
	apiCPU      float64 // kube-apiserver's user+system seconds
	bytes       int64   // received by the nodes from the API server's namespace
	programming scale.Buckets
}

// costs reads the API server's CPU, the nodes' received bytes and the
// proxies' programming histograms merged. Before the window a proxy may
// not export the histogram yet (ours has no series before its first
// observation): it counts as empty unless mustHist.
func (b *bench) costs(ctx context.Context, ps []*idleProxy, mustHist bool) (costs, error) {
	var c costs
	u, err := scale.ProcessUsage(b.srv.APIServerPID())
	if err != nil {
		return c, fmt.Errorf("kube-apiserver: %w", err)
	}
	c.apiCPU = u.CPUSeconds + u.ChildCPUSeconds
	c.programming = scale.Buckets{}
	for _, ip := range ps {
		n, err := rxBytes(ip.ns, "api0")
		if err != nil {
			return c, err
		}
		c.bytes += n
		h, err := scale.ReadBuckets(ctx, ip.metrics, "http://"+metricsAddr+"/metrics", scale.ProgrammingMetric)
		if err != nil && mustHist {
			return c, fmt.Errorf("%s in %s: %w", ip.kind, ip.ns, err)
		}
		c.programming.Add(h)
	}
	return c, nil
}

// rxBytes reads interface dev's received bytes in namespace ns.
func rxBytes(ns, dev string) (int64, error) {
	var data []byte
	err := apiserver.RunInNetNS(ns, func() error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	})
	if err != nil {
		return 0, err
	}
	return parseRxBytes(string(data), dev)
}

// parseRxBytes finds dev's received bytes in a /proc/net/dev text.
func parseRxBytes(text, dev string) (int64, error) {
	for _, l := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no interface %s in /proc/net/dev", dev)
}

// memAvailable is the machine's MemAvailable in bytes (0 if unknown).
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// percentile is the nearest-rank percentile p (0 < p <= 1) of sorted
// durations; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// latencySettingsFromEnv reads KNP_LATENCY_NODES (default 50),
// KNP_LATENCY_SERVICES (5000), KNP_LATENCY_RATE (changes per second, 5),
// KNP_LATENCY_WINDOW (60s), KNP_LATENCY_PROXIES (ours,upstream) and
// KNP_SCALE_BOUND (how long the first syncs may take, 10m).
func latencySettingsFromEnv(t *testing.T) latencySettings {
	s := latencySettings{nodes: 50, services: 5000, rate: 5, window: time.Minute, bound: bound(t), kinds: []string{"ours", "upstream"}}
	for _, v := range []struct {
		env string
		out *int
	}{{"KNP_LATENCY_NODES", &s.nodes}, {"KNP_LATENCY_SERVICES", &s.services}} {
		if e := os.Getenv(v.env); e != "" {
			n, err := strconv.Atoi(e)
			if err != nil || n <= 0 {
				t.Fatalf("%s: %q is not a positive number", v.env, e)
			}
			*v.out = n
		}
	}
	if e := os.Getenv("KNP_LATENCY_RATE"); e != "" {
		r, err := strconv.ParseFloat(e, 64)
		if err != nil || r <= 0 {
			t.Fatalf("KNP_LATENCY_RATE: %q is not a positive rate", e)
		}
		s.rate = r
	}
	if e := os.Getenv("KNP_LATENCY_WINDOW"); e != "" {
		d, err := time.ParseDuration(e)
		if err != nil || d <= 0 {
			t.Fatalf("KNP_LATENCY_WINDOW: %q is not a duration", e)
		}
		s.window = d
	}
	if e := os.Getenv("KNP_LATENCY_PROXIES"); e != "" {
		s.kinds = strings.Split(e, ",")
		for _, k := range s.kinds {
			if k != "ours" && k != "upstream" {
				t.Fatalf("KNP_LATENCY_PROXIES: unknown proxy %q (ours, upstream)", k)
			}
		}
	}
	return s
}

// TestNetworkProgrammingLatency is `make bench-latency`: one API server,
// N proxies of one kind at a time each in its own node namespace, and a
// window of endpoint changes and Service creations at a fixed rate; for
// every change and node, the time from the API write to the change read
// back from the node's kernel. KNP_LATENCY_BENCH=1; settings in
// latencySettingsFromEnv; the table also written to KNP_LATENCY_OUT.
func TestNetworkProgrammingLatency(t *testing.T) {
	if os.Getenv("KNP_LATENCY_BENCH") != "1" {
		t.Skip("the network programming latency benchmark runs with KNP_LATENCY_BENCH=1 (make bench-latency): it takes many minutes")
	}
	kubeProxy := needs(t)
	s := latencySettingsFromEnv(t)
	b := newBench(t, kubeProxy, s.services)
	b.fill(s.services)
	w := newWorkload(b.api, b.created, b.per)
	var rs []latencyResult
	for _, kind := range s.kinds {
		r, err := b.measureLatency(w, kind, s)
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			continue
		}
		t.Logf("%s:\n%s", kind, formatLatency([]latencyResult{r}))
		rs = append(rs, r)
	}
	table := formatLatency(rs)
	t.Logf("MEASURED network programming latency:\n%s", table)
	if path := os.Getenv("KNP_LATENCY_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// TestNetworkProgrammingLatencySmoke runs the latency harness small (two
// nodes of ours, 20 Services, about ten changes): every change must reach
// both kernels and both proxies' histograms.
func TestNetworkProgrammingLatencySmoke(t *testing.T) {
	kubeProxy := needs(t)
	b := newBench(t, kubeProxy, 0)
	b.fillShape(scale.Shape{Services: 20, PerService: 3})
	w := newWorkload(b.api, b.created, b.per)
	r, err := b.measureLatency(w, "ours", latencySettings{nodes: 2, rate: 5, window: 2 * time.Second, bound: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("smoke:\n%s", formatLatency([]latencyResult{r}))
	if r.Synced != 2 || r.Changes < 5 {
		t.Fatalf("%d of 2 nodes synced, %d changes written", r.Synced, r.Changes)
	}
	if r.NotSeen > 0 || r.Lost > 0 || len(r.Latencies) != 2*r.Changes {
		t.Errorf("%d node x change pairs seen of %d: %d not seen, %d lost", len(r.Latencies), 2*r.Changes, r.NotSeen, r.Lost)
	}
	if r.Programming.Count() == 0 || r.APIBytes == 0 || r.APICPU == 0 || r.StartBytes == 0 {
		t.Errorf("no cost measured: %d programming observations, %d bytes (%d at the start), %.2f API CPU s",
			r.Programming.Count(), r.APIBytes, r.StartBytes, r.APICPU)
	}
}

// formatLatency prints one row per proxy kind, and upstream's p99 over ours.
func formatLatency(rs []latencyResult) string {
	var b bytes.Buffer
	fmt.Fprintln(&b, "| proxy | nodes | Services | changes (rate) | API write p50 / p99 | write to kernel p50 / p99 / max | not seen / lost (held at end) | proxies' histogram p50 / p99 (n) | API server CPU s | MiB to the nodes | start: API server CPU s, MiB per node | load average |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	var ours, upstream time.Duration
	for _, r := range rs {
		if r.Synced < r.Nodes {
			fmt.Fprintf(&b, "| %s | %d of %d synced after %.0f s | %d | - | - | - | - | - | - | - | - | %s |\n",
				r.Proxy, r.Synced, r.Nodes, r.StartToSynced.Seconds(), r.Services, r.Load)
			continue
		}
		p99 := percentile(r.Latencies, 0.99)
		switch r.Proxy {
		case "ours":
			ours = p99
		case "upstream":
			upstream = p99
		}
		written := fmt.Sprintf("%d in %.0f s (%.4g/s)", r.Changes, r.Window.Seconds(), r.Rate)
		if r.Skipped+r.WriteErrs > 0 {
			written += fmt.Sprintf(", %d skipped, %d failed", r.Skipped, r.WriteErrs)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s / %s | %s / %s / %s | %d / %d (%d) | %s | %.1f | %.1f | %.1f, %.2f | %s |\n",
			r.Proxy, r.Nodes, r.Services, written,
			scale.Secs(percentile(r.Writes, 0.5).Seconds()), scale.Secs(percentile(r.Writes, 0.99).Seconds()),
			scale.Secs(percentile(r.Latencies, 0.5).Seconds()), scale.Secs(p99.Seconds()), scale.Secs(percentile(r.Latencies, 1).Seconds()),
			r.NotSeen, r.Lost, r.LostHeld, histCell(r.Programming), r.APICPU, float64(r.APIBytes)/(1<<20),
			r.StartAPICPU, float64(r.StartBytes)/float64(r.Nodes)/(1<<20), r.Load)
	}
	if ours > 0 && upstream > 0 {
		fmt.Fprintf(&b, "\nupstream's p99 over ours: %s\n", scale.Ratio(upstream.Seconds(), ours.Seconds()))
	}
	return b.String()
}

// histCell is a merged histogram's p50 / p99 and count; "> x" where the
// rank lies past the largest bucket.
func histCell(h scale.Buckets) string {
	if h.Count() == 0 {
		return "- (0)"
	}
	cell := func(q float64) string {
		v, over := h.Quantile(q)
		if over {
			return atLeast(scale.Secs(v))
		}
		return scale.Secs(v)
	}
	return fmt.Sprintf("%s / %s (%d)", cell(0.5), cell(0.99), h.Count())
}
