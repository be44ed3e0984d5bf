package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// The histograms both upstream kube-proxy and kube-nftproxy export: every
// sync of their rules, and the full ones (ours records its first sync
// there alone; upstream's IPVS mode records only the first, where every
// sync is a full one).
const (
	SyncMetric     = "kubeproxy_sync_proxy_rules_duration_seconds"
	FullSyncMetric = "kubeproxy_sync_full_proxy_rules_duration_seconds"
)

// Histogram is the sum and count of one histogram series.
type Histogram struct {
	Sum   float64
	Count int
}

// Since returns the mean duration of the observations between before and
// h, and how many there were (0: none).
func (h Histogram) Since(before Histogram) (mean float64, n int) {
	n = h.Count - before.Count
	if n <= 0 {
		return 0, 0
	}
	return (h.Sum - before.Sum) / float64(n), n
}

// SyncHistogram reads the histogram metric (SyncMetric, FullSyncMetric)
// from the /metrics page at url.
func SyncHistogram(ctx context.Context, hc *http.Client, url, metric string) (Histogram, error) {
	var h Histogram
	err := readMetrics(ctx, hc, url, func(r io.Reader) (err error) {
		h, err = ParseHistogram(r, metric)
		return err
	})
	return h, err
}

// readMetrics GETs the /metrics page at url and hands its body to parse.
func readMetrics(ctx context.Context, hc *http.Client, url string, parse func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	if err := parse(resp.Body); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	return nil
}

// ParseHistogram reads histogram metric from a Prometheus text page: the
// IPv4 series of upstream's (labelled by ip_family; its IPv6 proxier syncs
// on its own), or ours (one series, no label).
func ParseHistogram(r io.Reader, metric string) (Histogram, error) {
	var h Histogram
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), metric+"_")
		if !ok {
			continue
		}
		field, labels, value, ok := splitSample(rest)
		if !ok || (labels != "" && !strings.Contains(labels, `ip_family="IPv4"`)) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch field {
		case "sum":
			h.Sum = v
			found = true
		case "count":
			h.Count = int(v)
		}
	}
	if err := sc.Err(); err != nil {
		return h, err
	}
	if !found {
		return h, errors.New("no " + metric + " in the metrics")
	}
	return h, nil
}

// splitSample splits `sum{labels} value` (labels optional).
func splitSample(s string) (field, labels, value string, ok bool) {
	sp := strings.LastIndexByte(s, ' ')
	if sp < 0 {
		return "", "", "", false
	}
	value = s[sp+1:]
	s = s[:sp]
	if i := strings.IndexByte(s, '{'); i >= 0 {
		return s[:i], s[i:], value, true
	}
	return s, "", value, true
}

// Usage is what a process has used so far.
type Usage struct {
	// CPUSeconds is its own user+system time; ChildCPUSeconds that of the
	// children it has waited for (upstream runs nft, ipset, iptables-restore).
	CPUSeconds, ChildCPUSeconds float64
	// PeakRSSMiB is its own peak resident set (VmHWM), children not included.
	PeakRSSMiB float64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// ProcessUsage reads a running process's Usage from /proc.
func ProcessUsage(pid int) (Usage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	u, err := parseStat(string(stat))
	if err != nil {
		return Usage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			u.PeakRSSMiB = kb / 1024
		}
	}
	return u, nil
}

// parseStat reads utime, stime, cutime and cstime from a /proc/<pid>/stat
// line: the 12th to 15th fields after the command name (which may hold
// spaces and parentheses, so it is skipped up to its last ')').
func parseStat(s string) (Usage, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Usage{}, errors.New("no command name")
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 15 {
		return Usage{}, errors.New("too short")
	}
	var t [4]float64
	for k := range t {
		v, err := strconv.ParseFloat(fields[11+k], 64)
		if err != nil {
			return Usage{}, fmt.Errorf("field %d: %w", 14+k, err)
		}
		t[k] = v / clockTicks
	}
	return Usage{CPUSeconds: t[0] + t[1], ChildCPUSeconds: t[2] + t[3]}, nil
}

// Shape is a benchmark's API content: Services Services with PerService
// endpoints each.
type Shape struct {
	Services, PerService int
}

func (s Shape) String() string { return fmt.Sprintf("%d x %d", s.Services, s.PerService) }

// Shapes parses a comma-separated list of shapes, each "N" (N Services of
// perService endpoints) or "NxE" (N Services of E endpoints); empty: 1k,
// 5k and 10k of perService.
func Shapes(spec string, perService int) ([]Shape, error) {
	if spec == "" {
		spec = "1000,5000,10000"
	}
	var out []Shape
	for _, f := range strings.Split(spec, ",") {
		n, e, hasE := strings.Cut(strings.TrimSpace(f), "x")
		s := Shape{PerService: perService}
		var err error
		if s.Services, err = strconv.Atoi(n); err != nil || s.Services <= 0 {
			return nil, fmt.Errorf("%q: %q is not a positive number of Services", f, n)
		}
		if hasE {
			if s.PerService, err = strconv.Atoi(e); err != nil || s.PerService <= 0 {
				return nil, fmt.Errorf("%q: %q is not a positive number of endpoints", f, e)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// Sizes parses a comma-separated list of Service counts (empty: 1k, 5k,
// 10k), for the benchmarks' size settings.
func Sizes(spec string) ([]int, error) {
	if spec == "" {
		spec = "1000,5000,10000"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Activity is a running process's CPU time and context switches so far,
// over all its threads: what an idle process costs the node.
type Activity struct {
	// CPUSeconds is its own user+system time (all threads);
	// ChildCPUSeconds that of the children it has waited for.
	CPUSeconds, ChildCPUSeconds float64
	// Switches is the sum over its threads of voluntary and involuntary
	// context switches: each is a wakeup of one of them (a thread that
	// has exited is no longer counted; a Go program's rarely exit).
	Switches int64
}

// ProcessActivity reads a running process's Activity from /proc.
func ProcessActivity(pid int) (Activity, error) {
	u, err := ProcessUsage(pid)
	if err != nil {
		return Activity{}, err
	}
	a := Activity{CPUSeconds: u.CPUSeconds, ChildCPUSeconds: u.ChildCPUSeconds}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return Activity{}, err
	}
	for _, t := range tasks {
		status, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue // the thread has just exited
		}
		a.Switches += parseSwitches(string(status))
	}
	return a, nil
}

// parseSwitches sums voluntary_ctxt_switches and nonvoluntary_ctxt_switches
// in a /proc/<pid>/task/<tid>/status text.
func parseSwitches(status string) int64 {
	var n int64
	for _, l := range strings.Split(status, "\n") {
		name, value, ok := strings.Cut(l, ":")
		if !ok || (name != "voluntary_ctxt_switches" && name != "nonvoluntary_ctxt_switches") {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err == nil {
			n += v
		}
	}
	return n
}

// Minus is the activity between before and a.
func (a Activity) Minus(before Activity) Activity {
	return Activity{CPUSeconds: a.CPUSeconds - before.CPUSeconds,
		ChildCPUSeconds: a.ChildCPUSeconds - before.ChildCPUSeconds, Switches: a.Switches - before.Switches}
}
