package nftbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
)

// idleResult is one proxy's cost over the idle window at one size.
type idleResult struct {
	Proxy    string
	Services int
	Window   time.Duration
	// Activity over the window: CPU (own and waited-for children's) and
	// context switches of the proxy's threads.
	Activity scale.Activity
	// Syncs the proxy's histogram counted during the window.
	Syncs int
	// Load is the host's 1-minute load average at the window's end.
	Load string
	// RSSMiB is the proxy's resident set (VmRSS) at the window's end.
	RSSMiB float64
	// Unfinished: no first sync within the bound; nothing measured.
	Unfinished bool
	// ToSynced is the proxy's activity from its start to its first sync
	// seen: the listing and one full sync. Upstream repeats a full sync
	// every hour (proxyutil.FullSyncPeriod) whatever changed; its
	// children's part (nft loading the whole ruleset) is what that costs
	// again, beyond the window's rate.
	ToSynced scale.Activity
}

// cpuPerHour is the window's CPU time (children included) scaled to an hour.
func (r idleResult) cpuPerHour() float64 {
	return (r.Activity.CPUSeconds + r.Activity.ChildCPUSeconds) * float64(time.Hour) / float64(r.Window)
}

// wakeupsPerMinute is the window's context switches scaled to a minute.
func (r idleResult) wakeupsPerMinute() float64 {
	return float64(r.Activity.Switches) * float64(time.Minute) / float64(r.Window)
}

// idleProxy is one proxy started for the idle measurement, in a node
// namespace of its own.
type idleProxy struct {
	kind    string
	ns      string
	p       *proxyProc
	hist    func(context.Context) (scale.Histogram, error)
	metrics *http.Client
	start   time.Time
	synced  bool
	// toSynced is the activity when the first sync was seen.
	toSynced scale.Activity
	cleanup  []func()
}

func (ip *idleProxy) close() {
	if ip.p != nil {
		ip.p.stop()
	}
	for i := len(ip.cleanup) - 1; i >= 0; i-- {
		ip.cleanup[i]()
	}
}

// idleNode makes node namespace i: a veth to the API server's namespace
// with addresses of its own (10.123.1.4i+1/30 there, +2 here; 64 nodes to
// each third byte from 1 up), so that many proxies run at once. It returns
// the namespace and the API server's address seen from it.
func idleNode(apiNS string, i int) (string, netip.Addr, func(), error) {
	ns, del, err := newNetNS("knp-ni-")
	if err != nil {
		return "", netip.Addr{}, nil, err
	}
	if i < 0 || i >= 64*254 {
		del()
		return "", netip.Addr{}, nil, fmt.Errorf("node %d: no addresses for it", i)
	}
	apiSide := netip.AddrFrom4([4]byte{10, 123, byte(1 + i/64), byte(4*(i%64) + 1)})
	nodeSide := netip.AddrFrom4([4]byte{10, 123, byte(1 + i/64), byte(4*(i%64) + 2)})
	if err := veth(apiNS, "ni-"+ns[len(ns)-6:], []string{apiSide.String() + "/30"},
		ns, "api0", []string{nodeSide.String() + "/30"}); err != nil {
		del()
		return "", netip.Addr{}, nil, err
	}
	return ns, apiSide, del, nil
}

// idleArgv is the bench's argv for kind, pointed at the API server through
// apiSide, with the default verbosity (as deployed), and ours serving pprof
// (unused unless KNP_IDLE_PROFILE is set: the flag alone costs nothing);
// KNP_IDLE_ARGS (split at spaces) comes last, for every kind.
func (b *bench) idleArgv(kind string, apiSide netip.Addr, i int) ([]string, error) {
	data, err := os.ReadFile(b.kubeconfig())
	if err != nil {
		return nil, err
	}
	s := strings.Replace(string(data), "https://"+apiSideAddr.String()+":", "https://"+apiSide.String()+":", 1)
	path := filepath.Join(b.dir, fmt.Sprintf("kubeconfig-idle-%d", i))
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		return nil, err
	}
	var argv []string
	for _, a := range b.argv(kind) {
		switch {
		case a == "--v=2":
		case strings.HasPrefix(a, "--kubeconfig="):
			argv = append(argv, "--kubeconfig="+path)
		default:
			argv = append(argv, a)
		}
	}
	if kind != "upstream" {
		argv = append(argv, "--profiling")
	}
	return append(argv, strings.Fields(os.Getenv("KNP_IDLE_ARGS"))...), nil
}

// startIdle starts proxy kind in node namespace i.
func (b *bench) startIdle(kind string, i int) (*idleProxy, error) {
	ns, apiSide, del, err := idleNode(b.apiNS, i)
	if err != nil {
		return nil, err
	}
	ip := &idleProxy{kind: kind, ns: ns, cleanup: []func(){del}}
	argv, err := b.idleArgv(kind, apiSide, i)
	if err != nil {
		ip.close()
		return nil, err
	}
	ip.metrics = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{
		Proxy: nil, DialContext: apiserver.DialerInNetNS(ns), DisableKeepAlives: true,
	}}
	ip.hist = func(ctx context.Context) (scale.Histogram, error) {
		return scale.SyncHistogram(ctx, ip.metrics, "http://"+metricsAddr+"/metrics", scale.SyncMetric)
	}
	logDir := keptLogs(b.t, b.dir)
	ip.start = time.Now()
	ip.p, err = startProxy(ns, filepath.Join(logDir, fmt.Sprintf("idle-%s-%d-node%d.log", kind, b.created, i)), argv)
	if err != nil {
		ip.close()
		return nil, err
	}
	return ip, nil
}

// waitSynced waits for every proxy's first sync, each for bound at most
// from its start; those that do not make it are marked unsynced.
func waitSynced(ctx context.Context, t *testing.T, ps []*idleProxy, bound time.Duration) error {
	for {
		pending, err := checkSynced(ctx, t, ps, bound)
		if err != nil || pending == 0 {
			return err
		}
		if err := pause(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the first syncs: %w", err)
		}
	}
}

// checkSynced marks the proxies whose first sync is now done, and returns
// how many are still within bound of their start without one.
func checkSynced(ctx context.Context, t *testing.T, ps []*idleProxy, bound time.Duration) (pending int, err error) {
	for _, ip := range ps {
		if ip.synced || time.Since(ip.start) > bound {
			continue
		}
		if err := ip.p.exited(); err != nil {
			return 0, err
		}
		if h, err := ip.hist(ctx); err == nil && h.Count > 0 {
			ip.synced = true
			ip.toSynced, _ = scale.ProcessActivity(ip.p.cmd.Process.Pid)
			t.Logf("%s %s: first sync %.1fs after start", ip.kind, ip.ns, time.Since(ip.start).Seconds())
			continue
		}
		pending++
	}
	return pending, nil
}

// measureIdle starts the proxies at once, each in its own node namespace,
// waits for their first syncs, lets them settle, then reads their activity
// at the start and end of one window, during which nothing changes and
// nobody asks them anything. With profileDir set, ours is then profiled
// over a second window of at most maxProfile (the profiler's own timer
// would skew the first).
func (b *bench) measureIdle(kinds []string, bound, settle, window time.Duration, profileDir string) ([]idleResult, error) {
	ctx := b.t.Context()
	var ps []*idleProxy
	defer func() {
		for _, ip := range ps {
			ip.close()
		}
	}()
	for i, kind := range kinds {
		ip, err := b.startIdle(kind, i)
		if err != nil {
			return nil, err
		}
		ps = append(ps, ip)
	}
	if err := waitSynced(ctx, b.t, ps, bound); err != nil {
		return nil, err
	}
	b.t.Logf("settling for %v", settle)
	if err := pause(ctx, settle); err != nil {
		return nil, err
	}
	before := make([]scale.Histogram, len(ps))
	start := make([]scale.Activity, len(ps))
	for i, ip := range ps {
		if ip.synced {
			before[i], _ = ip.hist(ctx)
		}
	}
	for i, ip := range ps {
		a, err := scale.ProcessActivity(ip.p.cmd.Process.Pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ip.kind, err)
		}
		start[i] = a
	}
	t0 := time.Now()
	if err := pause(ctx, window); err != nil {
		return nil, err
	}
	var rs []idleResult
	for i, ip := range ps {
		a, err := scale.ProcessActivity(ip.p.cmd.Process.Pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ip.kind, err)
		}
		rss, err := vmRSS(ip.p.cmd.Process.Pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ip.kind, err)
		}
		rs = append(rs, idleResult{Proxy: ip.kind, Services: b.created, Window: time.Since(t0),
			Activity: a.Minus(start[i]), Unfinished: !ip.synced, ToSynced: ip.toSynced, RSSMiB: rss})
	}
	load := loadAverage()
	for i, ip := range ps {
		rs[i].Load = load
		if ip.synced {
			after, err := ip.hist(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ip.kind, err)
			}
			rs[i].Syncs = after.Count - before[i].Count
		}
		if err := ip.p.exited(); err != nil {
			return nil, err
		}
	}
	if profileDir != "" {
		for _, ip := range ps {
			if ip.kind == "ours" && ip.synced {
				b.profile(ctx, ip, window, profileDir)
			}
		}
	}
	return rs, nil
}

// maxProfile bounds the profile's window: the metrics client gives up
// after 10 minutes.
const maxProfile = 2 * time.Minute

// profile writes a CPU profile of ours over window (at most maxProfile) to
// dir and logs its top.
func (b *bench) profile(ctx context.Context, ip *idleProxy, window time.Duration, dir string) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, int(min(window, maxProfile).Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		b.t.Error(err)
		return
	}
	resp, err := ip.metrics.Do(req)
	if err != nil {
		b.t.Errorf("profiling ours: %v", err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.t.Errorf("profiling ours: HTTP %d, %v", resp.StatusCode, err)
		return
	}
	path := filepath.Join(dir, fmt.Sprintf("idle-ours-%d.pprof", b.created))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.t.Error(err)
		return
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=40", path).CombinedOutput()
	b.t.Logf("ours' idle CPU profile (%s):\n%s%v", path, out, err)
}

// loadAverage is the host's load averages (1, 5, 15 minutes).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// idleSettings reads KNP_IDLE_SIZES (default 10000), KNP_IDLE_WINDOW
// (default 120s) and KNP_IDLE_SETTLE (default 45s: past the first periodic
// sync and the deletion of chains the first syncs left).
func idleSettings(t *testing.T) (sizes []int, window, settle time.Duration) {
	spec := os.Getenv("KNP_IDLE_SIZES")
	if spec == "" {
		spec = "10000"
	}
	sizes, err := scale.Sizes(spec)
	if err != nil {
		t.Fatalf("KNP_IDLE_SIZES: %v", err)
	}
	durations := []struct {
		env string
		def time.Duration
		out *time.Duration
	}{{"KNP_IDLE_WINDOW", 120 * time.Second, &window}, {"KNP_IDLE_SETTLE", 45 * time.Second, &settle}}
	for _, d := range durations {
		*d.out = d.def
		if s := os.Getenv(d.env); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v <= 0 {
				t.Fatalf("%s: %q is not a duration", d.env, s)
			}
			*d.out = v
		}
	}
	return sizes, window, settle
}

// TestNFTablesIdle is `make bench-idle`: both proxies synced and left
// alone, side by side at once, each in its own node namespace against the
// same API server; their CPU and wakeups over a window in which nothing
// changes. KNP_IDLE_BENCH=1; KNP_IDLE_SIZES, KNP_IDLE_WINDOW,
// KNP_IDLE_SETTLE, KNP_SCALE_PROXIES, KNP_SCALE_BOUND; the table also
// written to KNP_IDLE_OUT, ours' CPU profile of a second window to the
// directory KNP_IDLE_PROFILE. KNP_IDLE_BASELINE names another build of
// kube-nftproxy (e.g. main's, to compare a change) run alongside as
// "baseline", with ours' flags.
func TestNFTablesIdle(t *testing.T) {
	if os.Getenv("KNP_IDLE_BENCH") != "1" {
		t.Skip("the idle benchmark runs with KNP_IDLE_BENCH=1 (make bench-idle): it takes many minutes")
	}
	kubeProxy := needs(t)
	sizes, window, settle := idleSettings(t)
	b := newBench(t, kubeProxy, slices.Max(sizes))
	limit := bound(t)
	kinds := proxies(t)
	if base := os.Getenv("KNP_IDLE_BASELINE"); base != "" {
		b.binaries["baseline"] = base
		kinds = append(kinds, "baseline")
	}
	var rs []idleResult
	for _, n := range sizes {
		b.fill(n)
		got, err := b.measureIdle(kinds, limit, settle, window, os.Getenv("KNP_IDLE_PROFILE"))
		if err != nil {
			t.Error(err)
			continue
		}
		rs = append(rs, got...)
	}
	table := formatIdle(rs)
	t.Logf("MEASURED idle cost side by side:\n%s", table)
	if path := os.Getenv("KNP_IDLE_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// formatIdle prints the idle results, and upstream's over ours.
func formatIdle(rs []idleResult) string {
	var b bytes.Buffer
	fmt.Fprintln(&b, "| Services x 10 | proxy | window | CPU s per hour | of which children | wakeups per minute | syncs in window | load average | CPU s start to synced (children) | RSS at the end MiB |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	by := map[string]map[int]idleResult{}
	for _, r := range rs {
		if by[r.Proxy] == nil {
			by[r.Proxy] = map[int]idleResult{}
		}
		by[r.Proxy][r.Services] = r
		if r.Unfinished {
			fmt.Fprintf(&b, "| %d | %s | - | not measured (no first sync) | - | - | - | %s | - | - |\n", r.Services, r.Proxy, r.Load)
			continue
		}
		children := float64(time.Hour) / float64(r.Window) * r.Activity.ChildCPUSeconds
		fmt.Fprintf(&b, "| %d | %s | %.0fs | %.2f | %.2f | %.1f | %d | %s | %.1f (%.1f) | %.0f |\n", r.Services, r.Proxy,
			r.Window.Seconds(), r.cpuPerHour(), children, r.wakeupsPerMinute(), r.Syncs, r.Load,
			r.ToSynced.CPUSeconds+r.ToSynced.ChildCPUSeconds, r.ToSynced.ChildCPUSeconds, r.RSSMiB)
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Services x 10 | over ours | CPU | wakeups |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- |")
	for _, r := range rs {
		o := by["ours"][r.Services]
		if r.Proxy == "ours" || r.Unfinished || o.Proxy == "" || o.Unfinished {
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", r.Services, r.Proxy, scale.Ratio(r.cpuPerHour(), o.cpuPerHour()),
			scale.Ratio(r.wakeupsPerMinute(), o.wakeupsPerMinute()))
	}
	return b.String()
}
