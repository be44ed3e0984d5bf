package proxy

// The soak's moving parts (soak_test.go): the churn through the API
// server, the disruptions of the API server and etcd, the sampling of the
// proxy's resources, and the summary.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// churner changes Services and endpoints through the API server, one change
// every soakStep, from one goroutine. A change the API server refuses or
// does not answer (it may be down) is counted and skipped: the final check
// compares the kernel with what the API server holds, not with what the
// churner meant.
type churner struct {
	do   func(ctx context.Context, method, path string, in, out any) error
	rng  *rand.Rand
	live []int       // churned Services believed to exist, by index
	gen  map[int]int // endpoint generation of each of live
	next int         // index of the next Service to create
	// deleted names the Services deleted, or tried to be.
	deleted []string
	// webWithD says whether soakPodD is among soak-web's endpoints.
	webWithD bool

	endpointChanges, created, removed, targetChanges int
	apiErrors                                        int
	firstErrors                                      []string
}

func newChurner(a *apiEnv) *churner {
	return &churner{do: scaleClient(a.srv), rng: rand.New(rand.NewPCG(1, 2)), gen: map[int]int{}}
}

func soakName(i int) string { return fmt.Sprintf("soak-%05d", i) }

// soakService is Service i of the churn; every tenth is a NodePort (the API
// server picks the port).
func soakService(i int) *corev1.Service {
	s := scaleService(soakName(i))
	if i%10 == 0 {
		s.Spec.Type = corev1.ServiceTypeNodePort
	}
	return s
}

// soakSlice is the EndpointSlice of Service i at endpoint generation gen:
// its ten addresses, or only five of them for odd generations.
func soakSlice(i, gen int) *discoveryv1.EndpointSlice {
	addrs := fakeEndpoints(i % soakAddrBlocks)
	if gen%2 == 1 {
		addrs = addrs[:5]
	}
	return scaleSlice(soakName(i), addrs)
}

// createInitial creates Services 0..n-1 and their slices with soakWorkers
// concurrent requests; any failure fails the test.
func (c *churner) createInitial(t *testing.T, n int) {
	t.Helper()
	t0 := time.Now()
	var next atomic.Int64
	errs := make(chan error, soakWorkers)
	var wg sync.WaitGroup
	for range soakWorkers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := c.do(t.Context(), "POST", servicesPath, soakService(i), nil); err != nil {
					errs <- err
					return
				}
				if err := c.do(t.Context(), "POST", slicesPath, soakSlice(i, 0), nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range n {
		c.live = append(c.live, i)
	}
	c.next = n
	t.Logf("created %d Services and their EndpointSlices in %v", n, time.Since(t0).Round(time.Millisecond))
}

// run makes one change every soakStep until ctx ends: every 25th step
// soak-web gains or loses pod-d, every 10th one Service is deleted and
// another created, and the others change one Service's endpoints.
func (c *churner) run(ctx context.Context) {
	tick := time.NewTicker(soakStep)
	defer tick.Stop()
	for step := 1; ; step++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var err error
		switch {
		case step%25 == 0:
			err = c.toggleTarget(ctx)
		case step%10 == 0:
			err = c.replaceService(ctx)
		default:
			err = c.changeEndpoints(ctx)
		}
		if err != nil && ctx.Err() == nil {
			c.apiErrors++
			if len(c.firstErrors) < 5 {
				c.firstErrors = append(c.firstErrors, time.Now().UTC().Format("15:04:05.000 ")+err.Error())
			}
		}
	}
}

// call is one request to the API server, bounded by soakCallTimeout.
func (c *churner) call(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
	defer cancel()
	return c.do(ctx, method, path, in, out)
}

// replaceSlice PUTs es over the slice of the same name, at its current
// resourceVersion.
func (c *churner) replaceSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error {
	var cur discoveryv1.EndpointSlice
	path := slicesPath + "/" + es.Name
	if err := c.call(ctx, "GET", path, nil, &cur); err != nil {
		return err
	}
	es.ResourceVersion = cur.ResourceVersion
	return c.call(ctx, "PUT", path, es, nil)
}

func (c *churner) changeEndpoints(ctx context.Context) error {
	if len(c.live) == 0 {
		return nil
	}
	i := c.live[c.rng.IntN(len(c.live))]
	c.gen[i]++
	if err := c.replaceSlice(ctx, soakSlice(i, c.gen[i])); err != nil {
		return fmt.Errorf("endpoints of %s: %w", soakName(i), err)
	}
	c.endpointChanges++
	return nil
}

// replaceService deletes a random live Service and its slice, then
// creates a new one.
func (c *churner) replaceService(ctx context.Context) error {
	if len(c.live) > 0 {
		k := c.rng.IntN(len(c.live))
		name := soakName(c.live[k])
		delete(c.gen, c.live[k])
		c.live = slices.Delete(c.live, k, k+1)
		c.deleted = append(c.deleted, name)
		if err := c.call(ctx, "DELETE", servicesPath+"/"+name, nil, nil); err != nil {
			return fmt.Errorf("delete Service %s: %w", name, err)
		}
		if err := c.call(ctx, "DELETE", slicesPath+"/"+name+"-ipv4", nil, nil); err != nil {
			return fmt.Errorf("delete EndpointSlice %s-ipv4: %w", name, err)
		}
		c.removed++
	}
	i := c.next
	c.next++
	c.live = append(c.live, i)
	if err := c.call(ctx, "POST", servicesPath, soakService(i), nil); err != nil {
		return fmt.Errorf("create Service %s: %w", soakName(i), err)
	}
	if err := c.call(ctx, "POST", slicesPath, soakSlice(i, 0), nil); err != nil {
		return fmt.Errorf("create EndpointSlice of %s: %w", soakName(i), err)
	}
	c.created++
	return nil
}

// toggleTarget adds pod-d to soak-web's endpoints, or takes it away again;
// pod-a and pod-b stay.
func (c *churner) toggleTarget(ctx context.Context) error {
	pods := []sandbox.Pod{podA, podB}
	if !c.webWithD {
		pods = append(pods, soakPodD)
	}
	if err := c.replaceSlice(ctx, apiSlice(soakWebName, nil, pods...)); err != nil {
		return fmt.Errorf("endpoints of %s: %w", soakWebName, err)
	}
	c.webWithD = !c.webWithD
	c.targetChanges++
	return nil
}

// disruption is one disruption done, and when.
type disruption struct {
	what     string
	from, to time.Time
}

// disruptor takes the API server and etcd down in turn: kill and restart
// the API server, kill and restart etcd, SIGSTOP the API server for pause
// and SIGCONT it; one every `every` of quiet after the previous one.
type disruptor struct {
	a     *apiEnv
	every time.Duration
	pause time.Duration
	logf  func(format string, args ...any)
	done  []disruption
	err   error // the disruption that could not be undone
}

func (d *disruptor) run(ctx context.Context) {
	kinds := []struct {
		what string
		do   func(context.Context) error
	}{
		{"API server killed and restarted", d.a.srv.RestartAPIServer},
		{"etcd killed and restarted", d.restartEtcd},
		{fmt.Sprintf("API server SIGSTOPped for %v", d.pause), d.pauseAPIServer},
	}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.every):
		}
		k := kinds[i%len(kinds)]
		// A disruption begun is seen through (a paused server resumed)
		// even when the soak's time is up meanwhile.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		from := time.Now()
		err := k.do(dctx)
		cancel()
		d.done = append(d.done, disruption{what: k.what, from: from, to: time.Now()})
		if err != nil {
			d.err = fmt.Errorf("%s: %w", k.what, err)
			return
		}
		d.logf("disruption: %s, %s-%s", k.what, from.UTC().Format("15:04:05.000"), time.Now().UTC().Format("15:04:05.000"))
	}
}

// restartEtcd restarts etcd and waits until the API server is ready again.
func (d *disruptor) restartEtcd(ctx context.Context) error {
	if err := d.a.srv.RestartEtcd(ctx); err != nil {
		return err
	}
	return d.a.srv.WaitReady(ctx)
}

// pauseAPIServer SIGSTOPs the API server for d.pause, then resumes it.
func (d *disruptor) pauseAPIServer(ctx context.Context) error {
	if err := d.a.srv.PauseAPIServer(); err != nil {
		return err
	}
	<-time.After(d.pause) // the disruption itself: the API server hung this long
	return d.a.srv.ResumeAPIServer(ctx)
}

// count is how many disruptions were what.
func (d *disruptor) count(what string) int {
	n := 0
	for _, x := range d.done {
		if x.what == what {
			n++
		}
	}
	return n
}

// procSample is the proxy's resources at one moment.
type procSample struct {
	rssKB, goroutines, fds, threads int
}

func (s procSample) String() string {
	return fmt.Sprintf("RSS %.1f MB, %d goroutines, %d fds, %d threads", float64(s.rssKB)/1024, s.goroutines, s.fds, s.threads)
}

// sampleProxy reads the proxy's RSS and threads from /proc, its open fds
// from /proc/PID/fd and its goroutines from go_goroutines on its /metrics.
func (a *apiEnv) sampleProxy(ctx context.Context) (procSample, error) {
	pid := a.proxy.proc.Pid()
	_, rss, err := procMemory(pid)
	if err != nil {
		return procSample{}, err
	}
	threads, err := procStatusInt(pid, "Threads")
	if err != nil {
		return procSample{}, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return procSample{}, err
	}
	m, err := a.fetchMetrics(ctx)
	if err != nil {
		return procSample{}, err
	}
	g, ok := m["go_goroutines"]
	if !ok {
		return procSample{}, fmt.Errorf("the proxy's /metrics has no go_goroutines")
	}
	return procSample{rssKB: rss, goroutines: int(g), fds: len(fds), threads: threads}, nil
}

// procStatusInt reads the number of field key ("Threads") of
// /proc/PID/status.
func procStatusInt(pid int, key string) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil {
				return 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, key)
}

// sampler samples the proxy every `every`, logging each sample and
// keeping the maximum of each figure.
type sampler struct {
	a     *apiEnv
	every time.Duration
	t0    time.Time
	logf  func(format string, args ...any)
	max   procSample
	n     int
}

func (s *sampler) run(ctx context.Context) {
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		smp, err := s.a.sampleProxy(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.logf("soak sample: %v", err)
			}
			continue
		}
		s.add(smp)
		s.logf("soak sample at %v: %v", time.Since(s.t0).Round(time.Second), smp)
	}
}

func (s *sampler) add(smp procSample) {
	s.n++
	s.max = procSample{
		rssKB: max(s.max.rssKB, smp.rssKB), goroutines: max(s.max.goroutines, smp.goroutines),
		fds: max(s.max.fds, smp.fds), threads: max(s.max.threads, smp.threads),
	}
}

// logSoak logs the soak's summary, each line starting with SOAK.
func logSoak(t *testing.T, cfg soakConfig, loops []*trafficLoop, sums []*echo.Summary, c *churner, d *disruptor, final soakState, start, end, peak procSample) {
	t.Helper()
	ok, failed := 0, 0
	var gap time.Duration
	for _, s := range sums {
		ok, failed = ok+s.OK, failed+s.Failed
		gap = max(gap, msDuration(s.LongestGapMS))
	}
	t.Logf("SOAK %v, %d churned Services (+2 targets), a request every %v per flow", cfg.duration, cfg.services, soakInterval)
	t.Logf("SOAK requests %d, failed %d, longest gap without a reply %v", ok+failed, failed, gap)
	for i, s := range sums {
		at := loops[i].started.Add(msDuration(s.LongestGapAtMS))
		t.Logf("SOAK   %s: %d ok, %d failed %v, longest gap %v from %s (%s)", loops[i].target,
			s.OK, s.Failed, s.Errors, msDuration(s.LongestGapMS), at.UTC().Format("15:04:05.000"), during(d.done, at))
	}
	t.Logf("SOAK churn: %d endpoint changes, %d Services created and %d deleted, %d make-before-break changes of soak-web's endpoints; %d API requests failed",
		c.endpointChanges, c.created, c.removed, c.targetChanges, c.apiErrors)
	for _, e := range c.firstErrors {
		t.Logf("SOAK   API error: %s", e)
	}
	t.Logf("SOAK disruptions: %d API server restarts, %d etcd restarts, %d SIGSTOPs of the API server (%v each)",
		d.count("API server killed and restarted"), d.count("etcd killed and restarted"),
		len(d.done)-d.count("API server killed and restarted")-d.count("etcd killed and restarted"), cfg.pause)
	t.Logf("SOAK proxy start -> end (max): RSS %.1f -> %.1f MB (%.1f), goroutines %d -> %d (%d), fds %d -> %d (%d), threads %d -> %d (%d)",
		float64(start.rssKB)/1024, float64(end.rssKB)/1024, float64(peak.rssKB)/1024,
		start.goroutines, end.goroutines, peak.goroutines, start.fds, end.fds, peak.fds, start.threads, end.threads, peak.threads)
	t.Logf("SOAK final state: the kernel equal to render of the API server's %d Services %v after the churn stopped; %d deleted Services, none left in the kernel",
		final.services, final.took.Round(time.Millisecond), final.gone)
}

// judgeSoak fails the test on any failed request (listing the first of
// each flow with the disruption it fell in, if any), on a flow that
// carried little, and on fds or goroutines growing beyond their bounds.
func judgeSoak(t *testing.T, loops []*trafficLoop, sums []*echo.Summary, done []disruption, start, end procSample) {
	t.Helper()
	for i, s := range sums {
		if s.Failed > 0 {
			t.Errorf("%s: %d of %d requests failed (%v)", loops[i].target, s.Failed, s.OK+s.Failed, s.Errors)
			for _, r := range firstN(s.Results, 5) {
				at := loops[i].started.Add(msDuration(r.AtMS))
				t.Logf("  request at %s (%s), after %.0f ms: %s", at.UTC().Format("15:04:05.000"), during(done, at), r.RTTMS, r.Error)
			}
		}
		if s.OK < 100 {
			t.Errorf("%s: only %d requests answered: not much of a flow", loops[i].target, s.OK)
		}
	}
	if more := end.fds - start.fds; more > soakMaxMoreFDs {
		t.Errorf("the proxy's open fds grew by %d (%d -> %d), more than %d: a leak", more, start.fds, end.fds, soakMaxMoreFDs)
	}
	if more := end.goroutines - start.goroutines; more > soakMaxMoreGoroutines {
		t.Errorf("the proxy's goroutines grew by %d (%d -> %d), more than %d: a leak", more, start.goroutines, end.goroutines, soakMaxMoreGoroutines)
	}
}

// during names the disruption under way at `at` (or just over: its effects
// may lag by a second), or says there was none.
func during(done []disruption, at time.Time) string {
	for _, d := range done {
		if !at.Before(d.from) && !at.After(d.to.Add(time.Second)) {
			return "during: " + d.what
		}
	}
	return "no disruption under way"
}
