// Command guest is the VM side of the IPVS side-by-side benchmark
// (e2e/ipvsbench): in a fresh VM it brings up the user-mode NIC, starts one
// proxy in IPVS mode against the host's API server, and measures its first
// full sync and one endpoint change, from the proxy's metrics (the same
// kubeproxy_sync_proxy_rules_duration_seconds both export) and from the
// kernel's IPVS table. It prints one "KNPBENCH {json}" line.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Result is what one boot measured; the host prints a table of them.
type Result struct {
	Proxy    string `json:"proxy"`
	Services int    `json:"services"`
	// StartToSynced: proxy started -> its first sync done with every
	// Service's virtual server in the kernel.
	StartToSynced float64 `json:"startToSynced"`
	// FirstSync is the duration of that first sync (the proxy's histogram).
	FirstSync float64 `json:"firstSync"`
	// Unfinished: no first sync within the bound; StartToSynced is then
	// the bound, a lower bound of both, and nothing else is measured.
	Unfinished bool `json:"unfinished,omitempty"`
	// ChangeToKernel: endpoint update sent to the API server -> the new
	// real server in the kernel's IPVS table.
	ChangeToKernel float64 `json:"changeToKernel"`
	// ChangeSync is the mean duration of the syncs that ended between the
	// change and its arrival in the kernel (ChangeSyncs of them in all).
	// Both are medians over the changes, each listed below.
	ChangeSync          float64   `json:"changeSync"`
	ChangeSyncs         int       `json:"changeSyncs"`
	ChangesToKernel     []float64 `json:"changesToKernel"`
	ChangeSyncDurations []float64 `json:"changeSyncDurations"`
	// Kernel state after the first sync.
	VirtualServers int `json:"virtualServers"`
	RealServers    int `json:"realServers"`
	// The proxy process: user+system CPU seconds and peak RSS, at the end.
	CPUSeconds float64 `json:"cpuSeconds"`
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	// SteadyRSSMiB is the proxy's RSS once it has settled after the
	// changes: steadyWait later, past a periodic sync and its read-back.
	SteadyRSSMiB float64 `json:"steadyRSSMiB"`
	Error        string  `json:"error,omitempty"`
}

type config struct {
	proxy, kind, kubeconfig, logPath string
	apiURL, serverName, caFile       string
	token                            string
	services, perService, changes    int
	timeout, firstSyncBound          time.Duration
	steadyWait                       time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.proxy, "proxy", "", "proxy binary")
	flag.StringVar(&c.kind, "kind", "", "upstream (kube-proxy) or ours (kube-nftproxy)")
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "the proxy's kubeconfig")
	flag.StringVar(&c.logPath, "log", "/tmp/proxy.log", "the proxy's log")
	flag.StringVar(&c.apiURL, "api", "https://10.0.2.100:6443", "API server URL")
	flag.StringVar(&c.serverName, "server-name", "127.0.0.1", "name the API server's certificate is checked against")
	flag.StringVar(&c.caFile, "ca", "", "API server CA (PEM)")
	flag.StringVar(&c.token, "token-file", "", "admin bearer token file (to change an endpoint)")
	flag.IntVar(&c.services, "services", 1000, "Services the API server has")
	flag.IntVar(&c.perService, "endpoints", 10, "endpoints per Service")
	flag.IntVar(&c.changes, "changes", 5, "endpoint changes to measure, one after the other")
	flag.DurationVar(&c.timeout, "timeout", time.Hour, "bound for the whole run")
	flag.DurationVar(&c.firstSyncBound, "first-sync-bound", 30*time.Minute, "give up waiting for the first sync after this long (reported as a lower bound)")
	flag.DurationVar(&c.steadyWait, "steady-wait", 40*time.Second, "how long after the changes the steady RSS is read (past one --ipvs-sync-period, 30s)")
	flag.Parse()

	r := Result{Proxy: c.kind, Services: c.services}
	if err := run(c, &r); err != nil {
		r.Error = err.Error()
		fmt.Fprintln(os.Stderr, "guest:", err)
		tail(c.logPath, 40)
	}
	b, _ := json.Marshal(r)
	fmt.Printf("KNPBENCH %s\n", b)
	if r.Error != "" {
		os.Exit(1)
	}
}

func run(c config, r *Result) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := setupGuest(); err != nil {
		return err
	}
	ca, err := os.ReadFile(c.caFile)
	if err != nil {
		return err
	}
	token, err := os.ReadFile(c.token)
	if err != nil {
		return err
	}
	api, err := scale.NewClient(c.apiURL, strings.TrimSpace(string(token)), ca, c.serverName, 2)
	if err != nil {
		return err
	}
	readyCtx, cancelReady := context.WithTimeout(ctx, 2*time.Minute)
	err = api.Ready(readyCtx)
	cancelReady()
	if err != nil {
		return err
	}
	logf("API server ready at %s", c.apiURL)
	vip, err := scale.ClusterIP(ctx, api, 0)
	if err != nil {
		return err
	}
	conn, err := ipvsnl.Dial("")
	if err != nil {
		return err
	}
	defer conn.Close()

	proc, err := startProxy(c)
	if err != nil {
		return err
	}
	defer stopProxy(proc)
	started := time.Now()
	logf("started %s (%s)", c.proxy, c.kind)

	// The first sync: the metric counts one, and every Service has its
	// virtual server (the kernel's table is read only once the proxy says
	// it synced: a read of 100k real servers costs the VM's only CPU).
	var first scale.Histogram
	lastNews := time.Now()
	for {
		if time.Since(started) > c.firstSyncBound {
			r.Unfinished = true
			r.StartToSynced = time.Since(started).Seconds()
			logf("no first sync within %v: giving up", c.firstSyncBound)
			tail(c.logPath, 5)
			r.CPUSeconds, r.PeakRSSMiB, err = usage(proc.Process.Pid)
			return err
		}
		if time.Since(lastNews) > time.Minute {
			h, err := syncHistogram(ctx, firstSyncMetric(c.kind))
			logf("no full sync yet after %v (metrics: %+v %v)", time.Since(started).Round(time.Second), h, err)
			tail(c.logPath, 5)
			if out, err := exec.Command("ps", "-o", "pid,stat,time,args").CombinedOutput(); err == nil {
				logf("processes:\n%s", out)
			}
			lastNews = time.Now()
		}
		if err := alive(proc); err != nil {
			return err
		}
		h, err := syncHistogram(ctx, firstSyncMetric(c.kind))
		if err == nil && h.Count > 0 {
			vss, err := conn.Read()
			if err != nil {
				return err
			}
			if len(vss) >= c.services {
				r.StartToSynced = time.Since(started).Seconds()
				r.FirstSync = h.Sum / float64(h.Count)
				first = h
				r.VirtualServers = len(vss)
				for _, v := range vss {
					r.RealServers += len(v.Dests)
				}
				break
			}
		}
		// Each poll costs the proxy's only CPU too: a few a second.
		if err := pause(ctx, 250*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the first sync: %w", err)
		}
	}
	logf("first sync after %.2fs (%.3fs, %d syncs): %d virtual servers, %d real servers",
		r.StartToSynced, r.FirstSync, first.Count, r.VirtualServers, r.RealServers)

	// One endpoint of Service 0 moves to a new address, changes times in
	// a row (the first change after a full sync is also the first run of
	// much code; the median is what a change costs).
	key := ipvsnl.ServiceKey{Addr: vip, Protocol: model.TCP, Port: scale.ServicePort}
	var walls, syncs []float64
	for i := range c.changes {
		wall, took, n, err := changeOne(ctx, c, api, conn, proc, key, netip.AddrFrom4([4]byte{100, 127, 255, byte(i + 1)}))
		if err != nil {
			return err
		}
		logf("change %d in the kernel after %.4fs (%d syncs of %.4fs)", i+1, wall, n, took)
		walls, syncs = append(walls, wall), append(syncs, took)
		r.ChangeSyncs += n
	}
	r.ChangesToKernel, r.ChangeSyncDurations = walls, syncs
	r.ChangeToKernel, r.ChangeSync = median(walls), median(syncs)
	// Steady state: nothing changes for a while (a periodic sync and its
	// read-back of IPVS happen meanwhile).
	if err := pause(ctx, c.steadyWait); err != nil {
		return err
	}
	if err := alive(proc); err != nil {
		return err
	}
	if r.SteadyRSSMiB, err = currentRSS(proc.Process.Pid); err != nil {
		return err
	}
	logf("steady RSS %.0f MiB after %v", r.SteadyRSSMiB, c.steadyWait)
	r.CPUSeconds, r.PeakRSSMiB, err = usage(proc.Process.Pid)
	return err
}

// currentRSS is a process's resident set (VmRSS) in MiB.
func currentRSS(pid int) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// changeOne moves endpoint 0 of Service 0 to addr and waits until the
// kernel has it and the proxy has recorded the sync that put it there. It
// returns the time from the request to the kernel, and the mean duration
// of the syncs that ended meanwhile (n of them).
func changeOne(ctx context.Context, c config, api *scale.Client, conn *ipvsnl.Conn, proc *exec.Cmd, key ipvsnl.ServiceKey, addr netip.Addr) (wall, took float64, n int, err error) {
	before, err := syncHistogram(ctx, scale.SyncMetric)
	if err != nil {
		return 0, 0, 0, err
	}
	sent := time.Now()
	if _, err := scale.SetEndpoint(ctx, api, 0, 0, addr); err != nil {
		return 0, 0, 0, err
	}
	// Our proxy applies it in milliseconds: poll one virtual server's real
	// servers (one small dump) often; upstream takes many seconds.
	every := 5 * time.Millisecond
	if c.kind == "upstream" {
		every = 200 * time.Millisecond
	}
	for {
		if err := alive(proc); err != nil {
			return 0, 0, 0, err
		}
		ds, err := conn.Dests(key)
		if err != nil {
			return 0, 0, 0, err
		}
		if hasAddr(ds, addr) {
			wall = time.Since(sent).Seconds()
			break
		}
		if err := pause(ctx, every); err != nil {
			return 0, 0, 0, fmt.Errorf("waiting for the changed endpoint in the kernel: %w", err)
		}
	}
	// The sync that applied it has ended once the histogram counts it
	// (the kernel may show the change before the proxy records the sync).
	for {
		after, err := syncHistogram(ctx, scale.SyncMetric)
		if err == nil && after.Count > before.Count {
			took, n = after.Since(before)
			return wall, took, n, nil
		}
		if err := pause(ctx, every); err != nil {
			return 0, 0, 0, fmt.Errorf("waiting for the change's sync to be recorded: %w", err)
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// setupGuest loads what upstream needs (the kernel would ask for most of
// it on demand) and brings up the NIC whose only peer is the API server.
func setupGuest() error {
	mods := []string{"virtio_net", "ip_tables", "iptable_filter", "iptable_nat", "iptable_mangle",
		"ip6_tables", "ip6table_filter", "ip6table_nat", "ip6table_mangle", "ip_set", "xt_set",
		"ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet",
		"ip_set_hash_net", "ip_set_bitmap_port", "xt_comment", "xt_mark", "xt_addrtype",
		"xt_conntrack", "xt_MASQUERADE", "xt_nat", "xt_multiport", "xt_physdev", "xt_statistic",
		"xt_recent", "ipt_REJECT", "ip6t_REJECT"}
	for _, m := range mods {
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "guest: modprobe %s: %v: %s\n", m, err, out)
		}
	}
	for _, args := range [][]string{
		{"link", "set", "eth0", "up"},
		{"addr", "add", "10.0.2.15/24", "dev", "eth0"},
	} {
		if out, err := exec.Command("/usr/sbin/ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "guest: %s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func startProxy(c config) (*exec.Cmd, error) {
	args := []string{
		"--proxy-mode=ipvs", "--kubeconfig=" + c.kubeconfig, "--hostname-override=knp-vm",
		"--cluster-cidr=10.244.0.0/16", "--metrics-bind-address=127.0.0.1:10249",
		"--healthz-bind-address=127.0.0.1:10256",
	}
	if c.kind == "upstream" {
		args = append(args, "-v=2")
	}
	log, err := os.Create(c.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.proxy, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", c.proxy, err)
	}
	go func() { _ = cmd.Wait(); log.Close() }()
	return cmd, nil
}

func alive(cmd *exec.Cmd) error {
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		return fmt.Errorf("the proxy exited: %w", err)
	}
	return nil
}

func stopProxy(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && alive(cmd) == nil {
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func hasAddr(ds []ipvsnl.Dest, a netip.Addr) bool {
	for _, d := range ds {
		if d.Addr.Addr() == a {
			return true
		}
	}
	return false
}

// firstSyncMetric is the histogram whose first observation is the first
// sync: ours records full syncs apart (follow-ups are partial); upstream's
// IPVS mode records every sync, each a full one, in the other only.
func firstSyncMetric(kind string) string {
	if kind == "upstream" {
		return scale.SyncMetric
	}
	return scale.FullSyncMetric
}

func syncHistogram(ctx context.Context, metric string) (scale.Histogram, error) {
	return scale.SyncHistogram(ctx, http.DefaultClient, "http://127.0.0.1:10249/metrics", metric)
}

// usage returns a process's CPU seconds (its own and its children's:
// upstream runs ipset and iptables) and peak RSS.
func usage(pid int) (cpu, rssMiB float64, err error) {
	u, err := scale.ProcessUsage(pid)
	return u.CPUSeconds + u.ChildCPUSeconds, u.PeakRSSMiB, err
}

func tail(path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintf(os.Stderr, "guest: last lines of %s:\n%s\n", path, strings.Join(lines, "\n"))
}
