// Package ipvsbench runs upstream kube-proxy's IPVS mode and ours side by
// side against one real API server, each in a fresh VM with real IPVS
// (hack/vm), at 1k / 5k / 10k Services x 10 endpoints, and prints one
// table: `make bench-ipvs`. It is a test, not a Go benchmark, because each
// measurement is one boot of minutes, not a loop.
package ipvsbench

import (
	"bufio"
	"encoding/json"
	"fmt"
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

// guestAPI is where the guest reaches the API server: QEMU's user-mode
// network forwards it to the server's port on the host's 127.0.0.1.
const (
	guestAPIAddr = "10.0.2.100"
	guestAPIPort = 6443
	nodeName     = "knp-vm"
)

func repoRoot(t *testing.T) string {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("finding the repository: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// sizesOf are the sizes proxy p runs at: KNP_IPVS_BENCH_SIZES, or for
// upstream KNP_IPVS_BENCH_UPSTREAM_SIZES when set (its exact run at 1k
// takes over 20 minutes: one from an earlier run may do).
func sizesOf(t *testing.T, p string) []int {
	if spec := os.Getenv("KNP_IPVS_BENCH_UPSTREAM_SIZES"); p == "upstream" && spec != "" {
		return parseSizes(t, spec)
	}
	return sizes(t)
}

func sizes(t *testing.T) []int {
	return parseSizes(t, os.Getenv("KNP_IPVS_BENCH_SIZES"))
}

func parseSizes(t *testing.T, spec string) []int {
	out, err := scale.Sizes(spec)
	if err != nil {
		t.Fatalf("KNP_IPVS_BENCH_SIZES: %v", err)
	}
	return out
}

// firstSyncBounds is how long each size's first sync may take. Upstream's
// takes about 30 minutes at 1k Services under TCG (an ipset exec per
// endpoint, 0.15-0.2 s each): beyond its bound the table shows a lower
// bound. KNP_IPVS_BENCH_BOUND: one duration per size, the last repeated
// (default 40m, 15m and 30m for 1k, 5k and 10k: long enough to tell 100x).
func firstSyncBounds(t *testing.T, sizes []int) map[int]time.Duration {
	spec := os.Getenv("KNP_IPVS_BENCH_BOUND")
	if spec == "" {
		spec = "40m,15m,30m"
	}
	var ds []time.Duration
	for _, f := range strings.Split(spec, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			t.Fatalf("KNP_IPVS_BENCH_BOUND: %q is not a duration", f)
		}
		ds = append(ds, d)
	}
	out := map[int]time.Duration{}
	for i, n := range sizes {
		out[n] = ds[min(i, len(ds)-1)]
	}
	return out
}

// proxies are KNP_IPVS_BENCH_PROXIES (ours, upstream, baseline), by
// default ours and upstream, and baseline when KNP_IPVS_BENCH_BASELINE is
// set: another build of ours (a binary's path) to compare with, each size
// run right after ours.
func proxies() []string {
	if p := os.Getenv("KNP_IPVS_BENCH_PROXIES"); p != "" {
		return strings.Split(p, ",")
	}
	if os.Getenv("KNP_IPVS_BENCH_BASELINE") != "" {
		return []string{"baseline", "ours", "upstream"}
	}
	return []string{"ours", "upstream"}
}

// run is one proxy at one size.
type run struct {
	proxy string
	size  int
}

// runOrder is proxies() at their sizes: each proxy at every size in turn,
// but baseline and ours alternate size by size (the same objects, the
// machine's load alike), before the others.
func runOrder(t *testing.T) []run {
	ps := proxies()
	var out []run
	if slices.Contains(ps, "baseline") && slices.Contains(ps, "ours") {
		for _, n := range sizes(t) {
			out = append(out, run{"baseline", n}, run{"ours", n})
		}
		ps = slices.DeleteFunc(ps, func(p string) bool { return p == "baseline" || p == "ours" })
	}
	for _, p := range ps {
		for _, n := range sizesOf(t, p) {
			out = append(out, run{p, n})
		}
	}
	return out
}

// result is the guest's Result (e2e/ipvsbench/guest).
type result struct {
	Proxy          string  `json:"proxy"`
	Services       int     `json:"services"`
	StartToSynced  float64 `json:"startToSynced"`
	FirstSync      float64 `json:"firstSync"`
	Unfinished     bool    `json:"unfinished"`
	ChangeToKernel float64 `json:"changeToKernel"`
	ChangeSync     float64 `json:"changeSync"`
	ChangeSyncs    int     `json:"changeSyncs"`
	VirtualServers int     `json:"virtualServers"`
	RealServers    int     `json:"realServers"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	PeakRSSMiB     float64 `json:"peakRSSMiB"`
	SteadyRSSMiB   float64 `json:"steadyRSSMiB"`
	Error          string  `json:"error"`
}

func TestIPVSSideBySide(t *testing.T) {
	if os.Getenv("KNP_IPVS_BENCH") != "1" {
		t.Skip("the IPVS side-by-side benchmark runs with KNP_IPVS_BENCH=1 (make bench-ipvs): it takes about an hour")
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root (the VM tier)")
	}
	root := repoRoot(t)
	ctx := t.Context()
	srv, err := apiserver.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := srv.Host[strings.LastIndexByte(srv.Host, ':')+1:]
	api, err := scale.NewClient(srv.URL, srv.Token, srv.CAPEM, "", 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := scale.Node(ctx, api, nodeName, netip.MustParseAddr("10.0.2.15")); err != nil {
		t.Fatal(err)
	}

	// The binaries: ours and the guest driver static, upstream from its cache.
	bin := t.TempDir()
	for _, b := range []struct{ out, pkg string }{
		{"kube-nftproxy", "./cmd/kube-nftproxy"},
		{"guest", "./e2e/ipvsbench/guest"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", b.pkg, err, out)
		}
	}
	build := exec.Command(filepath.Join(root, "hack/kube-proxy/build.sh"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("hack/kube-proxy/build.sh: %v\n%s", err, out)
	}
	upstream, err := exec.Command(filepath.Join(root, "hack/kube-proxy/build.sh"), "--print").Output()
	if err != nil {
		t.Fatal(err)
	}
	binaries := map[string]string{
		"ours":     filepath.Join(bin, "kube-nftproxy"),
		"upstream": strings.TrimSpace(string(upstream)),
		"baseline": os.Getenv("KNP_IPVS_BENCH_BASELINE"),
	}

	bounds := firstSyncBounds(t, sizes(t))
	// Ours at every size first, then upstream: the short runs and
	// upstream's exact one at the smallest size want a quiet machine;
	// upstream's bounded runs at the larger sizes give lower bounds anyway.
	var results []result
	created := 0
	for _, r := range runOrder(t) {
		path := binaries[r.proxy]
		if path == "" {
			t.Fatalf("KNP_IPVS_BENCH_PROXIES: unknown proxy %q (ours, upstream, baseline with KNP_IPVS_BENCH_BASELINE)", r.proxy)
		}
		n := r.size
		t0 := time.Now()
		switch {
		case n > created:
			if err := scale.Populate(ctx, api, scale.Spec{From: created, To: n, PerService: 10, Node: nodeName}); err != nil {
				t.Fatal(err)
			}
			t.Logf("created Services %d..%d with 10 endpoints each in %v", created, n-1, time.Since(t0).Round(time.Millisecond))
		case n < created:
			if err := scale.Depopulate(ctx, api, n, created, 0); err != nil {
				t.Fatal(err)
			}
			t.Logf("deleted Services %d..%d in %v", n, created-1, time.Since(t0).Round(time.Millisecond))
		}
		created = n
		results = append(results, boot(t, root, srv, hostPort, r.proxy, path, bin, n, bounds[n]))
		// Every proxy sees the same objects: put the moved endpoint back.
		if _, err := scale.SetEndpoint(ctx, api, 0, 0, scale.EndpointAddr(0, 0, 10)); err != nil {
			t.Fatal(err)
		}
	}
	printTable(t, results)
}

// boot runs one proxy at one size in a fresh VM and returns what the
// guest measured.
func boot(t *testing.T, root string, srv *apiserver.Server, hostPort, kind, proxy, bin string, n int, bound time.Duration) result {
	share := t.TempDir()
	out := t.TempDir()
	files := map[string][]byte{
		"ca.pem": srv.CAPEM,
		"token":  []byte(srv.Token),
		"kubeconfig": []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: host
  cluster:
    server: https://%s:%d
    tls-server-name: 127.0.0.1
    certificate-authority: /mnt/share/ca.pem
users:
- name: kube-proxy
  user:
    token: %s
contexts:
- name: kube-proxy
  context: {cluster: host, user: kube-proxy}
current-context: kube-proxy
`, guestAPIAddr, guestAPIPort, srv.ProxyToken)),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(share, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, src := range map[string]string{"proxy": proxy, "guest": filepath.Join(bin, "guest")} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(share, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	timeout := int(bound.Seconds()) + 600
	guestKind := kind
	if kind == "baseline" {
		guestKind = "ours" // another build of ours
	}
	script := fmt.Sprintf(`#!/bin/sh
exec 3>"$1"
echo "KNPVM start %[1]s-%[2]d" >&3
/mnt/share/guest -proxy /mnt/share/proxy -kind %[1]s -kubeconfig /mnt/share/kubeconfig \
	-ca /mnt/share/ca.pem -token-file /mnt/share/token -services %[2]d -timeout %[3]ds \
	-first-sync-bound %[4]v >&3 2>&1
printf '\nKNPVM end %[1]s-%[2]d rc=%%d\n' $? >&3
`, guestKind, n, timeout-60, bound)
	if err := os.WriteFile(filepath.Join(share, "guest.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	cmd := exec.Command(filepath.Join(root, "hack/vm/boot.sh"), share, out)
	cmd.Env = append(os.Environ(),
		fmt.Sprintf("KNP_VM_GUESTFWD=%s:%d=%s", guestAPIAddr, guestAPIPort, hostPort),
		fmt.Sprintf("KNP_VM_TIMEOUT=%d", timeout),
		"KNP_VM_MEM=3072",
	)
	bootOut, bootErr := cmd.CombinedOutput()
	elapsed := time.Since(t0)
	log, _ := os.ReadFile(filepath.Join(out, "results.log"))
	var r result
	found := false
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(string(log), "\r", "")))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "KNPBENCH "); i >= 0 {
			if err := json.Unmarshal([]byte(line[i+len("KNPBENCH "):]), &r); err == nil {
				found = true
			}
		}
	}
	t.Logf("%s at %d Services: boot of %v\n%s", kind, n, elapsed.Round(time.Second), log)
	if !found || r.Error != "" || bootErr != nil {
		console, _ := os.ReadFile(filepath.Join(out, "console.log"))
		t.Errorf("%s at %d Services: no result (boot: %v %s; guest: %s)\nconsole tail:\n%s",
			kind, n, bootErr, bootOut, r.Error, lastLines(string(console), 20))
	}
	r.Proxy, r.Services = kind, n
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func printTable(t *testing.T, rs []result) {
	var b strings.Builder
	fmt.Fprintln(&b, "| Services x 10 | proxy | start to synced | full sync | change to kernel | change sync | CPU s | peak RSS MiB | steady RSS MiB |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	by := map[string]map[int]result{}
	for _, r := range rs {
		if by[r.Proxy] == nil {
			by[r.Proxy] = map[int]result{}
		}
		by[r.Proxy][r.Services] = r
		start, full := scale.Secs(r.StartToSynced), scale.Secs(r.FirstSync)
		if r.Unfinished {
			start, full = "> "+start+" (unfinished)", "> "+start
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %.1f | %.0f | %.0f |\n", r.Services, r.Proxy,
			start, full, scale.Secs(r.ChangeToKernel), scale.Secs(r.ChangeSync), r.CPUSeconds, r.PeakRSSMiB, r.SteadyRSSMiB)
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Services x 10 | full sync: upstream / ours | one change sync: upstream / ours | change to kernel: upstream / ours |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- |")
	for _, r := range rs {
		o, u := by["ours"][r.Services], by["upstream"][r.Services]
		if r.Proxy != "ours" || u.Proxy == "" || o.FirstSync == 0 {
			continue
		}
		if u.Unfinished {
			fmt.Fprintf(&b, "| %d | > %.0fx | - | - |\n", r.Services, u.StartToSynced/o.FirstSync)
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", r.Services, scale.Ratio(u.FirstSync, o.FirstSync),
			scale.Ratio(u.ChangeSync, o.ChangeSync), scale.Ratio(u.ChangeToKernel, o.ChangeToKernel))
	}
	t.Logf("MEASURED IPVS mode side by side (QEMU TCG, 1 vCPU, Debian 6.1 kernel):\n%s", b.String())
	if path := os.Getenv("KNP_IPVS_BENCH_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}
