// Package nftbench runs upstream kube-proxy v1.37.1 in nftables mode and
// kube-nftproxy side by side against one real API server filled with N
// Services x E endpoints (every 10th a NodePort), each proxy in a fresh
// network namespace of its own, one after the other, and prints one table
// of both and their ratio: `make bench-scale`. Each proxy is measured from
// its start to its first complete sync, then for one Service added and one
// endpoint changed, both until real TCP traffic from the node reaches the
// new backend (a server in a pod namespace the harness creates), and for
// its CPU time, peak and steady RSS and the rules it wrote; for ours, the
// kernel's part of its first sync, and for both the kernel's smallest
// commit beside.
package nftbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

const (
	nodeName = "knp-bench"
	// perService is the endpoints per Service of every harness but
	// bench-scale's shapes (KNP_SCALE_SIZES "NxE").
	perService    = 10
	nodePortEvery = 10
	// probeService is the Service each run adds, with one endpoint on the
	// pod, and whose endpoint it then moves.
	probeService = "scale-probe"
	// quiet is how long no sync must have ended before a change is made:
	// more than both proxies' default minimum sync period (1 s), so the
	// change is synced at once rather than held back by the rate limit.
	quiet = 2 * time.Second
)

// result is one proxy's run at one shape; durations in seconds.
type result struct {
	Proxy string
	Shape scale.Shape
	// StartToSynced: process started -> its sync histogram counts a first
	// sync (which the ruleset then shows complete). FirstSync is that
	// sync's duration, by the proxy's own histogram.
	StartToSynced, FirstSync float64
	// Unfinished: no first sync within the bound; StartToSynced is the
	// time waited and FirstSync the time since upstream's log said the
	// sync began (0 if it did not), both lower bounds; nothing else but
	// usage is measured.
	Unfinished bool
	// Add: the Service created (its slice, with one endpoint on the pod,
	// exists already) -> a connection to its ClusterIP answered by the
	// pod. AddSync is the mean of the AddSyncs syncs it took.
	AddToTraffic, AddSync float64
	AddSyncs              int
	// Change: the slice updated with the endpoint at the pod's other
	// address -> a new connection answered there.
	ChangeToTraffic, ChangeSync float64
	ChangeSyncs                 int
	// SmallestCommit: the kernel's smallest commit in the proxy's
	// namespace afterwards (a chain added and deleted in a table of the
	// harness's, the median of floorSamples, each floorSpacing after the
	// last, as a change comes after the caches went cold): the floor of
	// any change's sync at that size, whoever sends it.
	SmallestCommit float64
	// KernelCommit: ours only, the kernel's part of our first sync (its
	// "synced" log line's kernel=): the kernel's commit of those objects.
	KernelCommit float64
	// SteadyMiB is the proxy's VmRSS at the end, after the changes.
	SteadyMiB float64
	// Usage at the end, of the proxy process (children: nft for upstream).
	// Its peak RSS is the proxy's own VmHWM. wait4's figure for a process
	// includes the RSS of the process that spawned it (a Go program's
	// children start in its address space and exec from there), so it
	// tells neither upstream's nft children's peak nor ours: not used.
	Usage scale.Usage
	// The proxy's tables once idle after its first sync: chains, rules
	// (anonymous sets and maps inline in a rule count as part of it), and
	// the elements of named sets and maps.
	Chains, Rules, Elements int
}

// bench is the API server and what every run shares.
type bench struct {
	t        *testing.T
	dir      string
	apiNS    string
	srv      *apiserver.Server
	api      *scale.Client
	binaries map[string]string
	// serviceRange is the API server's IPv4 Service range, where the
	// fill asks for each Service's address.
	serviceRange netip.Prefix
	// created Services exist, each with per endpoints.
	created, per int
}

// ranges are the API server's Service range and NodePort range for a
// bench that holds up to services Services (every 10th a NodePort): the
// defaults' /16 and 10,000 ports fit 60,000; beyond, a /15 and 20,000.
func ranges(services int) (serviceRange netip.Prefix, nodePorts string) {
	if services <= 60000 {
		return netip.MustParsePrefix("10.96.0.0/16"), "30000-39999"
	}
	return netip.MustParsePrefix("10.96.0.0/15"), "30000-49999"
}

// needs skips the test (fails it with KNP_REQUIRE_APISERVER=1) when
// something the harness runs is missing, and returns upstream kube-proxy.
func needs(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping the side-by-side test in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and nftables")
	}
	kubeProxy := os.Getenv("KNP_KUBE_PROXY")
	if kubeProxy == "" {
		cache := os.Getenv("KNP_CACHE")
		if cache == "" {
			cache = "/var/cache/kube-nftproxy"
		}
		kubeProxy = filepath.Join(cache, "k8s-v1.37.1", "bin", "kube-proxy")
	}
	var missing error
	if err := apiserver.Available(); err != nil {
		missing = err
	} else if _, err := os.Stat(kubeProxy); err != nil {
		missing = fmt.Errorf("upstream kube-proxy: %w (build it with hack/kube-proxy/build.sh)", err)
	} else if _, err := exec.LookPath("nft"); err != nil {
		missing = fmt.Errorf("%w (upstream's nftables mode runs nft: apt-get install nftables)", err)
	}
	if missing != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", missing)
		}
		t.Skipf("skipping: %v", missing)
	}
	return kubeProxy
}

// newBench starts the API server in a namespace of its own (reachable
// from each node namespace over a veth), with room for up to services
// Services (see ranges), and builds our proxy.
func newBench(t *testing.T, kubeProxy string, services int) *bench {
	t.Helper()
	b := &bench{t: t, dir: t.TempDir()}
	serviceRange, nodePorts := ranges(services)
	b.serviceRange = serviceRange
	ours, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", b.dir)
	if err != nil {
		t.Fatal(err)
	}
	b.binaries = map[string]string{"ours": ours, "upstream": kubeProxy}
	ns, del, err := newNetNS("knp-nbapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(del)
	b.apiNS = ns
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// Every 10th of 50k Services is a NodePort: more than the default
	// range's 2768 ports.
	b.srv, err = apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: ns,
		ServiceCIDR: serviceRange.String() + ",fd00:10:96::/112",
		ExtraArgs:   []string{"--bind-address=0.0.0.0", "--service-node-port-range=" + nodePorts},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.api, err = scale.NewClientDialer(b.srv.URL, b.srv.Token, b.srv.CAPEM, "", 16, apiserver.DialerInNetNS(ns))
	if err != nil {
		t.Fatal(err)
	}
	if err := scale.Node(ctx, b.api, nodeName, nodeAddr); err != nil {
		t.Fatal(err)
	}
	return b
}

// fill creates Services up to n with perService endpoints each.
func (b *bench) fill(n int) { b.fillShape(scale.Shape{Services: n, PerService: perService}) }

// fillShape makes the API server hold shape's Services: those missing are
// created; with another number of endpoints per Service, all of them anew.
// The API server's data after a fill is kept under seedDir and loaded
// instead of filling again in later runs (50k took a quarter of an hour).
func (b *bench) fillShape(shape scale.Shape) {
	n := shape.Services
	if n <= b.created && shape.PerService == b.per {
		return
	}
	t0 := time.Now()
	seed := seedDir(shape)
	if seed != "" {
		if err := b.srv.LoadData(b.t.Context(), seed); err == nil {
			b.t.Logf("loaded the API server's data with %v Services from %s in %v", shape, seed, time.Since(t0).Round(time.Millisecond))
			b.created, b.per = n, shape.PerService
			return
		} else if !errors.Is(err, os.ErrNotExist) {
			b.t.Logf("not loading %s: %v", seed, err)
		}
	}
	if shape.PerService != b.per && b.created > 0 {
		if err := scale.Depopulate(b.t.Context(), b.api, 0, b.created, 16); err != nil {
			b.t.Fatal(err)
		}
		b.created = 0
	}
	spec := scale.Spec{From: b.created, To: n, PerService: shape.PerService, Node: nodeName, NodePortEvery: nodePortEvery,
		ClusterIPs: b.serviceRange}
	if err := scale.Populate(b.t.Context(), b.api, spec); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("created Services %d..%d with %d endpoints each (every %dth a NodePort) in %v",
		b.created, n-1, shape.PerService, nodePortEvery, time.Since(t0).Round(time.Millisecond))
	b.created, b.per = n, shape.PerService
	if seed != "" {
		if err := b.srv.SaveData(b.t.Context(), seed); err != nil {
			b.t.Fatalf("saving the API server's data: %v", err)
		}
	}
}

// seedDir is where the API server's data with the Services of shape is
// kept: under $KNP_CACHE/bench-etcd, named for the harness's objects and
// the API server and etcd binaries; "" with KNP_BENCH_SEED=0.
func seedDir(shape scale.Shape) string {
	if os.Getenv("KNP_BENCH_SEED") == "0" {
		return ""
	}
	cache := os.Getenv("KNP_CACHE")
	if cache == "" {
		cache = "/var/cache/kube-nftproxy"
	}
	id := func(path string) string {
		st, err := os.Stat(path)
		if err != nil {
			return "missing"
		}
		return fmt.Sprintf("%x-%x", st.Size(), st.ModTime().Unix())
	}
	name := fmt.Sprintf("v1-%d-x%d-np%d-%s-api%s-etcd%s", shape.Services, shape.PerService, nodePortEvery, nodeName,
		id(apiserver.BinaryPath()), id(apiserver.EtcdPath()))
	return filepath.Join(cache, "bench-etcd", name)
}

// kubeconfig is the proxy kubeconfig pointed at the API server through
// its end of the node's veth, still checking the name 127.0.0.1.
func (b *bench) kubeconfig() string {
	data, err := os.ReadFile(b.srv.ProxyKubeconfig)
	if err != nil {
		b.t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(b.srv.Host)
	s := strings.Replace(string(data), "server: "+b.srv.URL,
		"server: https://"+net.JoinHostPort(apiSideAddr.String(), port)+"\n    tls-server-name: 127.0.0.1", 1)
	path := filepath.Join(b.dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		b.t.Fatal(err)
	}
	return path
}

// argv is how a proxy is run: the same flags for both but the mode, and no
// sysctl writes (other namespaces share them).
func (b *bench) argv(kind string) []string {
	args := []string{b.binaries[kind],
		"--kubeconfig=" + b.kubeconfig(), "--hostname-override=" + nodeName,
		"--cluster-cidr=" + clusterCIDR,
		"--metrics-bind-address=" + metricsAddr, "--healthz-bind-address=" + healthzAddr,
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--proxy-mode=nftables", // both: iptables is kube-proxy's default
	}
	// At -v=2 upstream logs when its sync begins, and ours each sync's
	// kernel time.
	return append(args, "--v=2")
}

// run measures one proxy at the current size; bound limits the wait for
// its first sync.
func (b *bench) run(kind string, bound time.Duration) (r result, err error) {
	r = result{Proxy: kind, Shape: scale.Shape{Services: b.created, PerService: b.per}}
	ctx, cancel := context.WithTimeout(b.t.Context(), bound+15*time.Minute)
	defer cancel()
	// Each run adds the probe Service anew.
	if err := scale.DeleteService(ctx, b.api, probeService); err != nil {
		return r, err
	}
	n, err := newNode(b.apiNS)
	if err != nil {
		return r, err
	}
	defer n.close()
	metrics := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: nil, DialContext: apiserver.DialerInNetNS(n.ns), DisableKeepAlives: true,
	}}
	hist := func() (scale.Histogram, error) {
		return scale.SyncHistogram(ctx, metrics, "http://"+metricsAddr+"/metrics", scale.SyncMetric)
	}

	logDir := keptLogs(b.t, b.dir)
	logPath := filepath.Join(logDir, fmt.Sprintf("%s-%dx%d.log", kind, b.created, b.per))
	start := time.Now()
	p, err := startProxy(n.ns, logPath, b.argv(kind))
	if err != nil {
		return r, err
	}
	defer p.stop()
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s at %v: %w\nlog tail:\n%s", kind, r.Shape, err, logTail(logPath, 30))
		}
	}()

	// The first sync.
	for {
		if err := p.exited(); err != nil {
			return r, err
		}
		if h, err := hist(); err == nil && h.Count > 0 {
			r.StartToSynced = time.Since(start).Seconds()
			r.FirstSync = h.Sum / float64(h.Count)
			break
		}
		if time.Since(start) > bound {
			r.Unfinished = true
			r.StartToSynced = time.Since(start).Seconds()
			if at, ok := syncStarted(logPath); ok {
				r.FirstSync = time.Since(at).Seconds()
			}
			b.t.Logf("%s: no first sync within %v; log tail:\n%s", kind, bound, logTail(logPath, 5))
			r.Usage, err = scale.ProcessUsage(p.cmd.Process.Pid)
			return r, err
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return r, fmt.Errorf("waiting for the first sync: %w", err)
		}
	}
	b.t.Logf("%s: first sync %.3fs after start (%.3fs)", kind, r.StartToSynced, r.FirstSync)
	// That sync was complete: every endpoint is in the kernel.
	c, err := countRules(ctx, b.t, n.ns)
	if err != nil {
		return r, err
	}
	if want := b.created * b.per; c.endpoints != want {
		return r, fmt.Errorf("right after the first sync the ruleset holds %d of the %d endpoint addresses", c.endpoints, want)
	}

	// One Service added: its slice first, so that one sync programs the
	// Service with its endpoint.
	if err := scale.CreateSlice(ctx, b.api, scale.SliceOf(probeService, podAddrs[:1], nodeName)); err != nil {
		return r, err
	}
	// What it wrote, listed again: upstream's IPv6 proxier syncs after its
	// IPv4 one, whose first sync is the one timed (a slice without its
	// Service adds nothing).
	if c, err = countRules(ctx, b.t, n.ns); err != nil {
		return r, err
	}
	r.Chains, r.Rules, r.Elements = c.chains, c.rules, c.elements
	before, err := waitQuiet(ctx, p, hist)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	vip, err := scale.CreateService(ctx, b.api, scale.ServiceNamed(probeService, false))
	if err != nil {
		return r, err
	}
	target := netip.AddrPortFrom(vip, scale.ServicePort)
	d, err := n.waitBackend(ctx, p, target, podAddrs[0], t0)
	if err != nil {
		return r, err
	}
	r.AddToTraffic = d.Seconds()
	if r.AddSync, r.AddSyncs, err = syncsSince(ctx, p, hist, before); err != nil {
		return r, err
	}
	b.t.Logf("%s: Service added: traffic after %.4fs (%d syncs of %.4fs)", kind, r.AddToTraffic, r.AddSyncs, r.AddSync)

	if err := b.changeEndpoint(ctx, n, p, hist, target, &r); err != nil {
		return r, err
	}
	b.t.Logf("%s: endpoint changed %d times: traffic after %.4fs, syncs of %.4fs (medians; at most %d syncs a change)", kind, changes, r.ChangeToTraffic, r.ChangeSync, r.ChangeSyncs)
	if r.SmallestCommit, err = smallestCommit(ctx, n.ns); err != nil {
		return r, err
	}
	b.t.Logf("%s: the kernel's smallest commit in its namespace: %.4fs (the change's sync is %.2f of it)", kind, r.SmallestCommit, r.ChangeSync/r.SmallestCommit)
	if r.Usage, err = scale.ProcessUsage(p.cmd.Process.Pid); err != nil {
		return r, err
	}
	if r.SteadyMiB, err = vmRSS(p.cmd.Process.Pid); err != nil {
		return r, err
	}
	if kind == "ours" {
		var first startup
		if err := parseTimeline(logPath, start, &first); err != nil {
			return r, err
		}
		r.KernelCommit = max(first.kernel, 0)
	}
	return r, nil
}

// syncStarted returns when upstream's log (at -v=2) says its first sync
// began: "Syncing nftables rules", after a klog header such as
// "I1123 12:26:23.056496" (local time, no year).
func syncStarted(logPath string) (time.Time, bool) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return time.Time{}, false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.Contains(l, `"Syncing nftables rules"`) || len(l) < 21 {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", l[1:21], time.Local)
		if err != nil {
			return time.Time{}, false
		}
		now := time.Now()
		return at.AddDate(now.Year(), 0, 0), true
	}
	return time.Time{}, false
}

// waitQuiet waits until no sync has ended for quiet and returns the
// histogram then.
func waitQuiet(ctx context.Context, p *proxyProc, hist func() (scale.Histogram, error)) (scale.Histogram, error) {
	last, err := hist()
	if err != nil {
		return last, err
	}
	since := time.Now()
	for time.Since(since) < quiet {
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return last, fmt.Errorf("waiting for %v without a sync: %w", quiet, err)
		}
		if err := p.exited(); err != nil {
			return last, err
		}
		h, err := hist()
		if err != nil {
			return last, err
		}
		if h.Count != last.Count {
			last, since = h, time.Now()
		}
	}
	return last, nil
}

// changes is how often run moves the probe Service's endpoint: one change
// alone is a sample of one, and the floor it is set against is a minimum.
const changes = 5

// changeEndpoint moves the probe Service's endpoint between the pod's two
// addresses changes times, each after the proxy went quiet, and records
// the medians of the time to traffic and of the sync each change caused
// (the mean when one caused several; ChangeSyncs is the most one caused).
func (b *bench) changeEndpoint(ctx context.Context, n *node, p *proxyProc, hist func() (scale.Histogram, error), target netip.AddrPort, r *result) error {
	path := scale.SlicesPath + "/" + probeService + "-ipv4"
	var traffic, syncTimes []float64
	for i := range changes {
		var es discoveryv1.EndpointSlice
		if err := b.api.Do(ctx, http.MethodGet, path, nil, &es); err != nil {
			return err
		}
		to := podAddrs[(i+1)%2]
		es.Endpoints[0].Addresses = []string{to.String()}
		before, err := waitQuiet(ctx, p, hist)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := b.api.Do(ctx, http.MethodPut, path, &es, nil); err != nil {
			return err
		}
		d, err := n.waitBackend(ctx, p, target, to, t0)
		if err != nil {
			return err
		}
		sync, syncs, err := syncsSince(ctx, p, hist, before)
		if err != nil {
			return err
		}
		traffic, syncTimes = append(traffic, d.Seconds()), append(syncTimes, sync)
		r.ChangeSyncs = max(r.ChangeSyncs, syncs)
	}
	r.ChangeToTraffic, r.ChangeSync = medianOf(traffic), medianOf(syncTimes)
	return nil
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// syncsSince waits until the histogram counts a sync after before (the
// traffic can flow before the proxy records the sync that made it) and
// returns their mean duration and number.
func syncsSince(ctx context.Context, p *proxyProc, hist func() (scale.Histogram, error), before scale.Histogram) (float64, int, error) {
	for {
		h, err := hist()
		if err != nil {
			return 0, 0, err
		}
		if mean, n := h.Since(before); n > 0 {
			return mean, n, nil
		}
		if err := p.exited(); err != nil {
			return 0, 0, err
		}
		if err := pause(ctx, 5*time.Millisecond); err != nil {
			return 0, 0, fmt.Errorf("waiting for the sync to be recorded: %w", err)
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// floorSamples smallest commits, floorSpacing apart, make SmallestCommit.
const (
	floorSamples = 5
	floorSpacing = 2 * time.Second
)

// smallestCommit times the kernel's smallest commit in namespace ns (see
// result.SmallestCommit) and returns the median, in seconds.
func smallestCommit(ctx context.Context, ns string) (float64, error) {
	k, err := nftlib.OpenKernel("/run/netns/" + ns)
	if err != nil {
		return 0, err
	}
	defer k.Close()
	const table, chain = "knp-bench-floor", "floor"
	kt := k.NewTx()
	kt.AddTable(nftlib.IPv4, table, "the bench harness's: the kernel's smallest commit")
	if err := k.CommitTx(kt); err != nil {
		return 0, fmt.Errorf("creating %s: %w", table, err)
	}
	var ds []float64
	for range floorSamples {
		if err := pause(ctx, floorSpacing); err != nil {
			return 0, err
		}
		kt := k.NewTx()
		kt.AddChains(nftlib.IPv4, table, []*nftlib.Chain{{Name: chain}})
		kt.DelChain(nftlib.IPv4, table, chain)
		t0 := time.Now()
		if err := k.CommitTx(kt); err != nil {
			return 0, fmt.Errorf("the smallest commit: %w", err)
		}
		ds = append(ds, time.Since(t0).Seconds())
	}
	kt = k.NewTx()
	kt.DelTable(nftlib.IPv4, table)
	if err := k.CommitTx(kt); err != nil {
		return 0, fmt.Errorf("deleting %s: %w", table, err)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// countRules counts, over netlink in namespace ns, the chains, rules and
// set/map elements (anonymous ones included) of the proxy's tables (named
// kube-*; not iptables-nft's), and the distinct endpoint addresses
// (scale's 100.64.0.0/10) their rules and elements hold. `nft -j list
// ruleset` took minutes past 10k Services.
func countRules(ctx context.Context, t *testing.T, ns string) (rulesetCount, error) {
	t0 := time.Now()
	k, err := nftlib.OpenKernel("/run/netns/" + ns)
	if err != nil {
		return rulesetCount{}, err
	}
	defer k.Close()
	seen := map[[4]byte]struct{}{}
	c, err := k.Count(func(table string) bool { return strings.HasPrefix(table, "kube-") }, func(v []byte) {
		if len(v) >= 4 && v[0] == 100 && v[1]&0xc0 == 64 {
			seen[[4]byte(v[:4])] = struct{}{}
		}
	})
	if err != nil {
		return rulesetCount{}, fmt.Errorf("counting the ruleset: %w", err)
	}
	t.Logf("ruleset counted in %v: %+v", time.Since(t0).Round(time.Millisecond), c)
	return rulesetCount{chains: c.Chains, rules: c.Rules, elements: c.Elements, endpoints: len(seen)}, ctx.Err()
}

type rulesetCount struct{ chains, rules, elements, endpoints int }

// shapes reads KNP_SCALE_SIZES for bench-scale: "N" (N Services x
// perService) or "NxE" (N Services x E endpoints), comma-separated.
func shapes(t *testing.T) []scale.Shape {
	out, err := scale.Shapes(os.Getenv("KNP_SCALE_SIZES"), perService)
	if err != nil {
		t.Fatalf("KNP_SCALE_SIZES: %v", err)
	}
	return out
}

// sizes reads KNP_SCALE_SIZES (default 1000,5000,10000).
func sizes(t *testing.T) []int {
	out, err := scale.Sizes(os.Getenv("KNP_SCALE_SIZES"))
	if err != nil {
		t.Fatalf("KNP_SCALE_SIZES: %v", err)
	}
	return out
}

// keptLogs is where the proxies' logs go: KNP_SCALE_LOGS, created if
// missing (a missing one failed every run of a shape), else dflt.
func keptLogs(t *testing.T, dflt string) string {
	d := os.Getenv("KNP_SCALE_LOGS")
	if d == "" {
		return dflt
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatalf("KNP_SCALE_LOGS: %v", err)
	}
	return d
}

// bound reads KNP_SCALE_BOUND: how long a proxy's first sync may take
// before the table shows a lower bound (default 10m).
func bound(t *testing.T) time.Duration {
	s := os.Getenv("KNP_SCALE_BOUND")
	if s == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("KNP_SCALE_BOUND: %q is not a duration", s)
	}
	return d
}

func proxies(t *testing.T) []string {
	spec := os.Getenv("KNP_SCALE_PROXIES")
	if spec == "" {
		return []string{"ours", "upstream"}
	}
	out := strings.Split(spec, ",")
	for _, p := range out {
		if p != "ours" && p != "upstream" {
			t.Fatalf("KNP_SCALE_PROXIES: unknown proxy %q (ours, upstream)", p)
		}
	}
	return out
}

// TestNFTablesSideBySide is `make bench-scale`: KNP_SCALE_BENCH=1, shapes
// in KNP_SCALE_SIZES, the table also written to KNP_SCALE_OUT.
func TestNFTablesSideBySide(t *testing.T) {
	if os.Getenv("KNP_SCALE_BENCH") != "1" {
		t.Skip("the nftables side-by-side benchmark runs with KNP_SCALE_BENCH=1 (make bench-scale): it takes many minutes")
	}
	kubeProxy := needs(t)
	all := shapes(t)
	most := 0
	for _, shape := range all {
		most = max(most, shape.Services)
	}
	b := newBench(t, kubeProxy, most)
	limit := bound(t)
	var rs []result
	for _, shape := range all {
		b.fillShape(shape)
		for _, kind := range proxies(t) {
			r, err := b.run(kind, limit)
			if err != nil {
				t.Error(err)
				continue
			}
			rs = append(rs, r)
		}
	}
	table := formatTable(rs)
	t.Logf("MEASURED nftables mode side by side:\n%s", table)
	if path := os.Getenv("KNP_SCALE_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// TestNFTablesSideBySideSmoke runs the whole harness at 50 Services x 3: both
// proxies sync completely and carry the added Service's and the changed
// endpoint's traffic. It proves the harness works; its numbers are logged,
// not judged.
func TestNFTablesSideBySideSmoke(t *testing.T) {
	kubeProxy := needs(t)
	b := newBench(t, kubeProxy, 0)
	b.fillShape(scale.Shape{Services: 50, PerService: 3})
	var rs []result
	for _, kind := range []string{"ours", "upstream"} {
		r, err := b.run(kind, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if r.Unfinished {
			t.Fatalf("%s did not sync 50 Services within 2 minutes", kind)
		}
		if r.AddSyncs == 0 || r.ChangeSyncs == 0 || r.Rules == 0 || r.Usage.PeakRSSMiB == 0 || r.SteadyMiB == 0 || kind == "ours" && r.KernelCommit == 0 {
			t.Errorf("%s: incomplete result %+v", kind, r)
		}
		rs = append(rs, r)
	}
	t.Logf("at 50 Services x 3:\n%s", formatTable(rs))
}

// formatTable prints the results, then upstream's figures over ours.
func formatTable(rs []result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "| Services x endpoints | proxy | start to synced | first sync | the kernel's commit of it | add: sync | add: create to traffic | change: sync (median of %d) | change: to traffic | smallest commit | CPU s | peak / steady RSS MiB | chains / rules / elements |\n", changes)
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	by := map[string]map[scale.Shape]result{}
	for _, r := range rs {
		if by[r.Proxy] == nil {
			by[r.Proxy] = map[scale.Shape]result{}
		}
		by[r.Proxy][r.Shape] = r
		start, first := scale.Secs(r.StartToSynced), scale.Secs(r.FirstSync)
		if r.Unfinished {
			start, first = atLeast(start)+" (unfinished)", atLeast(first)
		}
		cpu := fmt.Sprintf("%.1f", r.Usage.CPUSeconds+r.Usage.ChildCPUSeconds)
		if r.Usage.ChildCPUSeconds >= 0.05 {
			cpu += fmt.Sprintf(" (children %.1f)", r.Usage.ChildCPUSeconds)
		}
		rss := fmt.Sprintf("%.0f / %.0f", r.Usage.PeakRSSMiB, r.SteadyMiB)
		fmt.Fprintf(&b, "| %v | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Shape, r.Proxy,
			start, first, scale.Secs(r.KernelCommit), syncs(r.AddSync, r.AddSyncs), scale.Secs(r.AddToTraffic), syncs(r.ChangeSync, r.ChangeSyncs),
			scale.Secs(r.ChangeToTraffic), smallestCell(r.SmallestCommit), cpu, rss, objects(r))
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Services x endpoints | ours: start to synced / kernel's commit | change: sync / smallest commit | upstream / ours: start to synced | first sync | add: sync | add: to traffic | change: sync | change: to traffic | CPU | peak RSS |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		o, u := by["ours"][r.Shape], by["upstream"][r.Shape]
		if r.Proxy != "ours" || o.Unfinished {
			continue
		}
		fmt.Fprintf(&b, "| %v | %s | %s | %s |\n", r.Shape, ratioOf(o.StartToSynced, o.KernelCommit),
			ratioOf(o.ChangeSync, o.SmallestCommit), upstreamOverOurs(o, u))
	}
	return b.String()
}

// ratioOf is a over b as "1.23" ("-" when either is unknown).
func ratioOf(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// upstreamOverOurs is the row's upstream-over-ours cells ("-" without an
// upstream run; lower bounds where upstream did not finish).
func upstreamOverOurs(o, u result) string {
	if u.Proxy == "" {
		return "- | - | - | - | - | - | - | -"
	}
	cpuU, cpuO := u.Usage.CPUSeconds+u.Usage.ChildCPUSeconds, o.Usage.CPUSeconds+o.Usage.ChildCPUSeconds
	if u.Unfinished {
		return fmt.Sprintf("%s | %s | - | - | - | - | %s | %s",
			atLeast(scale.Ratio(u.StartToSynced, o.StartToSynced)), atLeast(scale.Ratio(u.FirstSync, o.FirstSync)),
			atLeast(scale.Ratio(cpuU, cpuO)), scale.Ratio(u.Usage.PeakRSSMiB, o.Usage.PeakRSSMiB))
	}
	return fmt.Sprintf("%s | %s | %s | %s | %s | %s | %s | %s",
		scale.Ratio(u.StartToSynced, o.StartToSynced), scale.Ratio(u.FirstSync, o.FirstSync),
		scale.Ratio(u.AddSync, o.AddSync), scale.Ratio(u.AddToTraffic, o.AddToTraffic),
		scale.Ratio(u.ChangeSync, o.ChangeSync), scale.Ratio(u.ChangeToTraffic, o.ChangeToTraffic),
		scale.Ratio(cpuU, cpuO), scale.Ratio(u.Usage.PeakRSSMiB, o.Usage.PeakRSSMiB))
}

// atLeast marks a figure as a lower bound.
func atLeast(s string) string {
	if s == "-" {
		return s
	}
	return "> " + s
}

func objects(r result) string {
	if r.Unfinished {
		return "-"
	}
	return fmt.Sprintf("%d / %d / %d", r.Chains, r.Rules, r.Elements)
}

func syncs(mean float64, n int) string {
	if n <= 1 {
		return scale.Secs(mean)
	}
	return fmt.Sprintf("%s (%d syncs)", scale.Secs(mean), n)
}

// smallestCell is a SmallestCommit for the table ("-": not measured, for an
// unfinished run).
func smallestCell(secs float64) string {
	if secs == 0 {
		return "-"
	}
	return scale.Secs(secs)
}
