package nftbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
)

// startup is one run of a proxy from its start to its first sync.
type startup struct {
	kind     string
	services int
	// Seconds from the process start: the metrics server answering, the
	// log's "caches filled", the first sync's start and end (by its log
	// line's took), and the harness seeing the sync counted.
	listening, filled, syncBegan, syncEnded, synced float64
	took, kernel                                    float64 // the first sync's, from its log line
	messages                                        int
	peakMiB, steadyMiB                              float64 // VmHWM; VmRSS after the first sync and a GC
	cpu                                             float64 // user+sys seconds until then
}

// TestStartup measures start to synced, its timeline from the proxy's
// log, peak RSS and the steady RSS after the first sync (after a GC), for
// our proxy and, with KNP_STARTUP_BASE (another build of it), that build,
// alternately, KNP_STARTUP_ROUNDS times each per size (KNP_SCALE_SIZES).
// With KNP_STARTUP_PROFILES, a CPU profile of each of our runs' start-up
// (from the metrics server's first answer, KNP_STARTUP_PROFILE_SECS long)
// is written there. KNP_STARTUP_BENCH=1 runs it.
func TestStartup(t *testing.T) {
	if os.Getenv("KNP_STARTUP_BENCH") != "1" {
		t.Skip("the start-up benchmark runs with KNP_STARTUP_BENCH=1")
	}
	kubeProxy := needs(t)
	b := newBench(t, kubeProxy, slices.Max(sizes(t)))
	kinds := []string{"ours"}
	if base := os.Getenv("KNP_STARTUP_BASE"); base != "" {
		b.binaries["base"] = base
		kinds = append(kinds, "base")
	}
	if os.Getenv("KNP_STARTUP_NOGZIP") == "ab" {
		b.binaries["nogzip"] = b.binaries["ours"]
		kinds = append(kinds, "nogzip")
	}
	rounds, _ := strconv.Atoi(os.Getenv("KNP_STARTUP_ROUNDS"))
	rounds = max(rounds, 1)
	var rs []startup
	for _, n := range sizes(t) {
		b.fill(n)
		for i := range rounds {
			for j := range kinds {
				kind := kinds[(i+j)%len(kinds)] // alternate which goes first
				r, err := b.startup(kind, i)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s", r.row())
				rs = append(rs, r)
			}
		}
	}
	var out strings.Builder
	fmt.Fprintln(&out, "| Services | proxy | metrics up | caches filled | sync began | sync ended | synced (harness) | took | kernel | messages | CPU s | peak RSS MiB | steady RSS MiB |")
	fmt.Fprintln(&out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		fmt.Fprintln(&out, r.row())
	}
	t.Logf("MEASURED start-up (load average %s):\n%s", loadAvg(), out.String())
}

func (r startup) row() string {
	return fmt.Sprintf("| %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %d | %.2f | %.0f | %.0f |",
		r.services, r.kind, r.listening, r.filled, r.syncBegan, r.syncEnded, r.synced, r.took, r.kernel,
		r.messages, r.cpu, r.peakMiB, r.steadyMiB)
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// startup runs one proxy of kind in a fresh node until its first sync.
func (b *bench) startup(kind string, round int) (r startup, err error) {
	r = startup{kind: kind, services: b.created}
	ctx, cancel := context.WithTimeout(b.t.Context(), 15*time.Minute)
	defer cancel()
	n, err := newNode(b.apiNS)
	if err != nil {
		return r, err
	}
	defer n.close()
	httpc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		Proxy: nil, DialContext: apiserver.DialerInNetNS(n.ns), DisableKeepAlives: true,
	}}
	logDir := keptLogs(b.t, b.dir)
	logPath := filepath.Join(logDir, fmt.Sprintf("startup-%s-%d-%d.log", kind, b.created, round))
	start := time.Now()
	p, err := startProxy(n.ns, logPath, startupArgv(kind, b.argv(kind)))
	if err != nil {
		return r, err
	}
	defer p.stop()
	profiled := make(chan error, 1)
	profiling := false
	for {
		if err := p.exited(); err != nil {
			return r, err
		}
		if !profiling && metricsUp(ctx, httpc) {
			r.listening, profiling = time.Since(start).Seconds(), true
			go func() { profiled <- b.cpuProfile(ctx, httpc, kind, round) }()
		}
		// The log, not the metrics: scraping them every few ms would
		// show in the profile.
		if data, _ := os.ReadFile(logPath); strings.Contains(string(data), `"synced"`) {
			r.synced = time.Since(start).Seconds()
			break
		}
		if err := pause(ctx, 5*time.Millisecond); err != nil {
			return r, err
		}
	}
	u, err := scale.ProcessUsage(p.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	r.peakMiB, r.cpu = u.PeakRSSMiB, u.CPUSeconds
	if err := <-profiled; err != nil {
		return r, err
	}
	heap := os.DevNull
	if dir := os.Getenv("KNP_STARTUP_PROFILES"); dir != "" {
		heap = filepath.Join(dir, fmt.Sprintf("heap-%s-%d-%d.pprof", kind, b.created, round))
	}
	if r.steadyMiB, err = steadyRSS(ctx, httpc, p.cmd.Process.Pid, heap); err != nil {
		return r, err
	}
	return r, parseTimeline(logPath, start, &r)
}

// startupArgv is argv with --profiling, the mode of KNP_STARTUP_MODE
// (default iptables: the topology whose commit is cheapest) and the
// arguments of KNP_STARTUP_ARGS (split at spaces).
func startupArgv(kind string, argv []string) []string {
	mode := os.Getenv("KNP_STARTUP_MODE")
	if mode == "" {
		mode = "iptables"
	}
	out := []string{}
	for _, a := range argv {
		if strings.HasPrefix(a, "--proxy-mode=") {
			a = "--proxy-mode=" + mode
		}
		out = append(out, a)
	}
	out = append(out, "--profiling")
	if os.Getenv("KNP_STARTUP_NOGZIP") == "1" || kind == "nogzip" {
		// The kubeconfig's disable-compression: the API server sends
		// its lists as they are rather than gzipped.
		for i, a := range out {
			if path, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
				out[i] = "--kubeconfig=" + withoutCompression(path)
			}
		}
	}
	return append(out, strings.Fields(os.Getenv("KNP_STARTUP_ARGS"))...)
}

// withoutCompression writes a copy of the kubeconfig at path whose
// cluster has disable-compression: true, and returns its path.
func withoutCompression(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	s := strings.Replace(string(data), "    tls-server-name:", "    disable-compression: true\n    tls-server-name:", 1)
	out := path + "-nogzip"
	if err := os.WriteFile(out, []byte(s), 0o600); err != nil {
		panic(err)
	}
	return out
}

// metricsUp reports whether the metrics server answers.
func metricsUp(ctx context.Context, c *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// cpuProfile writes a CPU profile of the proxy's start-up to
// KNP_STARTUP_PROFILES, if set.
func (b *bench) cpuProfile(ctx context.Context, c *http.Client, kind string, round int) error {
	dir := os.Getenv("KNP_STARTUP_PROFILES")
	if dir == "" || kind == "base" {
		return nil
	}
	secs := os.Getenv("KNP_STARTUP_PROFILE_SECS")
	if secs == "" {
		secs = "5"
	}
	path := filepath.Join(dir, fmt.Sprintf("cpu-%s-%d-%d.pprof", kind, b.created, round))
	return httpToFile(ctx, c, "http://"+metricsAddr+"/debug/pprof/profile?seconds="+secs, path)
}

func httpToFile(ctx context.Context, c *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// steadyRSS forces a GC in the proxy (pprof's heap?gc=1) and returns its
// VmRSS once it stops falling (the heap profile taken goes to
// heapProfile) (the scavenger returns memory over time),
// at most 10 s later.
func steadyRSS(ctx context.Context, c *http.Client, pid int, heapProfile string) (float64, error) {
	if err := httpToFile(ctx, c, "http://"+metricsAddr+"/debug/pprof/heap?gc=1", heapProfile); err != nil {
		return 0, err
	}
	last, err := vmRSS(pid)
	deadline := time.Now().Add(10 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		if err := pause(ctx, 500*time.Millisecond); err != nil {
			return last, err
		}
		cur, err := vmRSS(pid)
		if err != nil {
			return last, err
		}
		if cur > last*0.99 {
			return cur, nil
		}
		last = cur
	}
	return last, err
}

func vmRSS(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

var (
	tookRE     = regexp.MustCompile(`took="?([0-9.]+[a-zµ]+)`)
	kernelRE   = regexp.MustCompile(`kernel="?([0-9.]+[a-zµ]+)`)
	messagesRE = regexp.MustCompile(`messages=([0-9]+)`)
)

// parseTimeline reads the times of the log's start-up lines (klog text
// headers, local time without a year) relative to start.
func parseTimeline(path string, start time.Time, r *startup) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	at := func(l string) float64 {
		if len(l) < 21 {
			return -1
		}
		t, err := time.ParseInLocation("0102 15:04:05.000000", l[1:21], time.Local)
		if err != nil {
			return -1
		}
		return t.AddDate(start.Year(), 0, 0).Sub(start).Seconds()
	}
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(l, "API server caches filled") && r.filled == 0:
			r.filled = at(l)
		case strings.Contains(l, `"synced"`) && r.syncEnded == 0:
			r.syncEnded = at(l)
			r.took, r.kernel = durationOf(tookRE, l), durationOf(kernelRE, l)
			if m := messagesRE.FindStringSubmatch(l); m != nil {
				r.messages, _ = strconv.Atoi(m[1])
			}
			r.syncBegan = r.syncEnded - r.took
		}
	}
	return nil
}

func durationOf(re *regexp.Regexp, l string) float64 {
	m := re.FindStringSubmatch(l)
	if m == nil {
		return -1
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		return -1
	}
	return d.Seconds()
}
