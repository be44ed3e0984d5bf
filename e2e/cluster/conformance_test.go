package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ciFocus is the CI subset of upstream's e2e suite on the most demanding
// shape (ciLayout): the Services [Conformance] specs that can run in
// parallel with others (15), the secondary family's pod-to-Service checks
// (2), and the zone-aware specs three zones let run (Traffic Distribution:
// 3 of 6 run, the others need six nodes; Topology Hints: 1).
const (
	ciFocus = `\[sig-network\] Services .*\[Conformance\]` +
		`|\[sig-network\] \[Feature:IPv6DualStack\] Granular Checks: Services Secondary IP Family \[LinuxOnly\] should function for pod-Service: (http|udp)` +
		`|\[sig-network\] (Traffic Distribution|Topology Hints) `
	ciSkip = `\[Serial\]|\[Disruptive\]`
	// ciLBFocus is the CI subset's load balancer part, when MetalLB is
	// cached: externalTrafficPolicy Local (only nodes with endpoints,
	// type=LoadBalancer, from pods), UDP kept while the server pod moves to
	// another node, session affinity with Local, and one port of two
	// protocols; about 100 s. The source-ranges and rolling-update specs
	// take 10-14 minutes each: make conformance runs them.
	ciLBFocus = `|\[sig-network\] LoadBalancers ExternalTrafficPolicy: Local \[Feature:LoadBalancer\] should (only target nodes with endpoints|work for type=LoadBalancer|work from pods)` +
		`|\[sig-network\] LoadBalancers \[Feature:LoadBalancer\] should (be able to preserve UDP traffic when server pod cycles for a LoadBalancer service on different nodes|have session affinity work for LoadBalancer service with Local traffic policy)` +
		`|\[sig-network\] Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer`
)

// ciLayout is the cluster CI's main subset runs on: dual-stack, three nodes
// in three zones, with MetalLB when its build is cached (missing names
// what is not), unless KNP_CLUSTER_FAMILY, KNP_CLUSTER_NODES or
// KNP_CLUSTER_LB say otherwise.
func ciLayout() (l Layout, missing []string) {
	l = DefaultLayout()
	if os.Getenv("KNP_CLUSTER_FAMILY") == "" {
		l.Family = FamilyDual
	}
	if os.Getenv("KNP_CLUSTER_NODES") == "" {
		l.Nodes, l.NodesErr = makeNodes(3), nil
	}
	if _, set := os.LookupEnv("KNP_CLUSTER_LB"); !set {
		if missing = l.metallbMissing(); len(missing) == 0 {
			l.LB = LBMetalLB
		}
	}
	return l, missing
}

// metallbMissing names what of MetalLB's build the cache lacks: the two
// binaries, its CRDs and its images in images.txt.
func (l Layout) metallbMissing() []string {
	var missing []string
	for _, f := range []string{l.ClusterBin("metallb-controller"), l.ClusterBin("metallb-speaker"), l.MetalLBCRDs()} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil || FindImage(imgs, "controller") == "" || FindImage(imgs, "speaker") == "" {
		missing = append(missing, "MetalLB's images in "+filepath.Join(l.ImagesDir(), "images.txt"))
	}
	return missing
}

// kubeadmFocus is the CI subset for kubeadm's objects with our image
// (ProxyKubeadm: iptables mode from kubeadm's config.conf, privileged):
// the localhost NodePort specs, which only that mode runs, and two basic
// Service specs.
const kubeadmFocus = `\[Feature:LocalhostNodePorts\]|\[sig-network\] Services should (serve a basic endpoint from pods|be able to create a functioning NodePort service) \[Conformance\]`

// TestClusterConformanceSubset brings the cluster up on ciLayout's shape
// with kube-nftproxy from deploy/ (KNP_CLUSTER_PROXY picks another), runs
// the smoke check and e2e.test on the CI subset, and tears the cluster down.
// It runs only when asked (KNP_CLUSTER_TIER=1, as `make cluster-test`
// does: alone, not beside the other packages' tests), as root and with a
// warm cache (binaries and images); a cold cache skips, or fails with
// KNP_REQUIRE_CLUSTER=1. It never touches a cluster that is already up.
func TestClusterConformanceSubset(t *testing.T) {
	l, missing := ciLayout()
	focus := ciFocus
	if l.LB == LBMetalLB {
		focus += ciLBFocus
	} else if len(missing) > 0 {
		t.Logf("NOTE: no load balancer specs: MetalLB is not cached (missing %s; KNP_CLUSTER_LB=metallb make cluster-build cluster-images)", strings.Join(missing, ", "))
	}
	runClusterSubset(t, l, focus, ciSkip)
}

// TestClusterKubeadmDropIn is the drop-in: kubeadm 1.37's kube-proxy
// objects (deploy/kubeadm) with only the image changed to ours, on the
// same terms as TestClusterConformanceSubset.
func TestClusterKubeadmDropIn(t *testing.T) {
	l := DefaultLayout()
	l.Proxy = ProxyKubeadm
	runClusterSubset(t, l, kubeadmFocus, ciSkip)
}

// TestClusterLocalhostNodePorts runs upstream's localhost NodePort specs
// against deploy/ in nftables mode with kube-proxy's alpha gate
// KubeProxyNFTablesLocalhostNodePorts on and --nodeport-addresses
// primary,localhost: answered by the userspace proxy, no route_localnet.
func TestClusterLocalhostNodePorts(t *testing.T) {
	l := DefaultLayout()
	l.Proxy = ProxyLocalhost
	runClusterSubset(t, l, `\[Feature:LocalhostNodePorts\]`, ciSkip)
}

// guestsFocus is IPVS mode's CI subset, its nodes in user-mode Linux
// guests: a ClusterIP, a NodePort, and session affinity (IPVS's
// persistence) through a NodePort.
const guestsFocus = `\[sig-network\] Services should (serve a basic endpoint from pods|be able to create a functioning NodePort service|have session affinity work for NodePort service \[LinuxOnly\]) \[Conformance\]`

// TestClusterIPVSModeInGuests runs deploy/ in IPVS mode (ProxyIPVS) on
// two nodes that are user-mode Linux guests with IPVS (vmnode.go), on the
// same terms as TestClusterConformanceSubset, when the guests' kernel is
// cached (hack/vm/uml-kernel.sh); without it, it skips saying so.
func TestClusterIPVSModeInGuests(t *testing.T) {
	if os.Getenv("KNP_CLUSTER_TIER") != "1" {
		t.Skip("the cluster tier runs with KNP_CLUSTER_TIER=1 (make cluster-test)")
	}
	out, err := exec.Command("../../hack/vm/uml-kernel.sh", "--cached").Output()
	if err != nil {
		t.Skip("NOTE: IPVS mode's cluster not run: no user-mode Linux kernel is cached (hack/vm/uml-kernel.sh builds it in about 15 minutes)")
	}
	l := DefaultLayout()
	l.Proxy = ProxyIPVS
	l.NodeKernel = strings.TrimSpace(string(out))
	l.GuestImages = GuestImagesCore
	runClusterSubset(t, l, guestsFocus, ciSkip)
}

// runClusterSubset brings l up, smoke-checks it, runs e2e.test on focus
// minus skip, and brings it down.
func runClusterSubset(t *testing.T, l Layout, focus, skipSpecs string) {
	if os.Getenv("KNP_CLUSTER_TIER") != "1" {
		t.Skip("the cluster tier runs with KNP_CLUSTER_TIER=1 (make cluster-test)")
	}
	skip := t.Skipf
	if os.Getenv("KNP_REQUIRE_CLUSTER") == "1" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("needs root: brings up a two-node Kubernetes cluster in network namespaces")
	}
	if missing := l.coldCache(); len(missing) > 0 {
		skip("cluster cache is cold, missing %s: run `make cluster-build cluster-images`", groupByDir(missing))
	}
	if up := l.alreadyUp(); up != "" {
		skip("a cluster is already up (%s): not clobbering it; `make cluster-down` frees the machine", up)
	}
	ctx, cancel := testContext(t)
	defer cancel()
	start := time.Now()
	t.Cleanup(func() {
		down := time.Now()
		if err := l.Down(context.Background(), t.Logf); err != nil {
			t.Errorf("cluster down: %v", err)
		}
		t.Logf("down in %v; whole test %v", time.Since(down).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	})
	if err := l.Up(ctx, filepath.Join("..", "..", "deploy"), t.Logf); err != nil {
		l.logPods(t)
		t.Fatalf("cluster up (%s): %v (logs in %s/logs)", l.Proxy, err, l.Dir)
	}
	if _, err := l.Smoke(ctx); err != nil {
		l.logPods(t)
		t.Fatalf("smoke: %v", err)
	}
	t.Logf("up (%s) and smoke-checked in %v", l.Proxy, time.Since(start).Round(100*time.Millisecond))
	s := l.runE2E(ctx, t, focus, skipSpecs)
	t.Logf("e2e.test %s", s)
	if s.Failed > 0 || s.Ran == 0 {
		t.Errorf("conformance subset (%s): ran %d, failed %d: %v", l.Proxy, s.Ran, s.Failed, s.Failures)
	}
}

// logPods logs every pod's state and kube-system's last warnings, for a
// cluster that did not come up: Down removes its logs, and CI keeps only
// the end of the output.
func (l Layout) logPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := l.kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	t.Logf("pods (%v):\n%s", err, pods)
	events, err := l.kubectl(ctx, "-n", "kube-system", "get", "events", "--field-selector=type=Warning",
		"--sort-by=.lastTimestamp", "-o", "custom-columns=AGE:.lastTimestamp,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message")
	if lines := strings.Split(strings.TrimSpace(events), "\n"); len(lines) > 12 {
		events = strings.Join(lines[len(lines)-12:], "\n")
	}
	t.Logf("kube-system warnings (%v):\n%s", err, events)
}

// testContext ends a minute before the test binary's deadline, leaving
// time for Down.
func testContext(t *testing.T) (context.Context, context.CancelFunc) {
	if d, ok := t.Deadline(); ok {
		return context.WithDeadline(context.Background(), d.Add(-time.Minute))
	}
	return context.WithCancel(context.Background())
}

// runE2E runs e2e.test inside the node network, its specs spread over
// e2eProcs processes, and sums its JUnit report; its output goes to the
// test log only on failure.
func (l Layout) runE2E(ctx context.Context, t *testing.T, focus, skip string) JUnitSummary {
	t.Helper()
	dir := t.TempDir()
	begin := time.Now()
	procs := e2eProcs()
	out, err := output(ctx, nsenter(l.NodeNet, l.e2eArgv(procs, dir, focus, skip)...)...)
	elapsed := time.Since(begin).Round(time.Second)
	s, jerr := ReadJUnit(filepath.Join(dir, "junit_01.xml"))
	if err != nil || jerr != nil {
		t.Logf("e2e.test output:\n%s", out)
		t.Fatalf("e2e.test after %v: %v; report: %v", elapsed, err, jerr)
	}
	t.Logf("e2e.test ran in %v (%d processes)", elapsed, procs)
	return s
}

// e2eProcs is how many processes run the tier's specs: KNP_CLUSTER_E2E_PROCS,
// default 3. The specs spend most of their time waiting for pods and
// polling, so three overlap well on two cores; none of the selected specs
// is [Serial].
func e2eProcs() int {
	if n, err := strconv.Atoi(os.Getenv("KNP_CLUSTER_E2E_PROCS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// e2eArgv is the command that runs e2e.test on focus minus skip with its
// report in dir: the binary itself for one process, the ginkgo CLI (which
// starts the processes and merges their reports) for more.
func (l Layout) e2eArgv(procs int, dir, focus, skip string) []string {
	common := []string{"--kubeconfig=" + l.Kubeconfig(), "--provider=skeleton",
		fmt.Sprintf("--num-nodes=%d", len(l.Nodes)), "--report-dir=" + dir}
	if procs <= 1 {
		return append(append([]string{l.K8sBin("e2e.test")}, common...),
			"--ginkgo.no-color", "--ginkgo.focus="+focus, "--ginkgo.skip="+skip)
	}
	return append([]string{l.ClusterBin("ginkgo"), "run", fmt.Sprintf("--procs=%d", procs), "--no-color",
		"--timeout=1h", "--focus=" + focus, "--skip=" + skip, l.K8sBin("e2e.test"), "--"}, common...)
}

// coldCache names what the cluster needs and the cache lacks: binaries
// (hack/cluster/build.sh) and image archives (hack/cluster/images.sh).
func (l Layout) coldCache() []string {
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "e2e.test"} {
		if !executable(l.K8sBin(b)) {
			missing = append(missing, l.K8sBin(b))
		}
	}
	for _, b := range []string{"etcd", "containerd", "containerd-shim-runc-v2", "ctr", "flanneld", "cni/bridge", "cni/flannel", "ginkgo"} {
		if !executable(l.ClusterBin(b)) {
			missing = append(missing, l.ClusterBin(b))
		}
	}
	if !executable(runcPath()) {
		missing = append(missing, runcPath())
	}
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		return append(missing, filepath.Join(l.ImagesDir(), "images.txt"))
	}
	for _, name := range []string{"pause", l.proxyImage(), "coredns", "agnhost", "flannel"} {
		if FindImage(imgs, name) == "" {
			missing = append(missing, "image "+name)
		}
	}
	for _, im := range imgs {
		if _, err := os.Stat(im.File); err != nil {
			missing = append(missing, im.File)
		}
	}
	return missing
}

// alreadyUp says why a cluster seems up: its state directory or one of its
// network namespaces exists.
func (l Layout) alreadyUp() string {
	if _, err := os.Stat(l.Dir); err == nil {
		return l.Dir + " exists"
	}
	for _, ns := range append([]string{l.NodeNet}, l.Nodes[0].Name, l.Nodes[1].Name) {
		if _, err := os.Stat(NetNSPath(ns)); err == nil {
			return "network namespace " + ns + " exists"
		}
	}
	return ""
}

// groupByDir writes paths as "dir/{a,b}; dir2/c", keeping their order, so
// a cold cache's skip message stays one readable line.
func groupByDir(paths []string) string {
	var dirs []string
	names := map[string][]string{}
	for _, p := range paths {
		d, n := filepath.Split(p)
		if _, ok := names[d]; !ok {
			dirs = append(dirs, d)
		}
		names[d] = append(names[d], n)
	}
	parts := make([]string, len(dirs))
	for i, d := range dirs {
		if len(names[d]) == 1 {
			parts[i] = d + names[d][0]
		} else {
			parts[i] = d + "{" + strings.Join(names[d], ",") + "}"
		}
	}
	return strings.Join(parts, "; ")
}

func TestGroupByDir(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"/c/bin/etcd"}, "/c/bin/etcd"},
		{[]string{"/c/k/kubelet", "/c/bin/etcd", "/c/k/e2e.test", "image agnhost"},
			"/c/k/{kubelet,e2e.test}; /c/bin/etcd; image agnhost"},
	} {
		if got := groupByDir(tc.in); got != tc.want {
			t.Errorf("groupByDir(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestE2EArgv(t *testing.T) {
	l := Layout{Dir: "/c", Cache: "/cache", Nodes: makeNodes(3)}
	for _, tc := range []struct {
		procs int
		want  string
	}{
		{1, "/cache/k8s-v1.37.1/bin/e2e.test --kubeconfig=/c/admin.kubeconfig --provider=skeleton --num-nodes=3 --report-dir=/r --ginkgo.no-color --ginkgo.focus=F --ginkgo.skip=S"},
		{3, "/cache/cluster/bin/ginkgo run --procs=3 --no-color --timeout=1h --focus=F --skip=S /cache/k8s-v1.37.1/bin/e2e.test -- --kubeconfig=/c/admin.kubeconfig --provider=skeleton --num-nodes=3 --report-dir=/r"},
	} {
		if got := strings.Join(l.e2eArgv(tc.procs, "/r", "F", "S"), " "); got != tc.want {
			t.Errorf("procs %d:\n got %s\nwant %s", tc.procs, got, tc.want)
		}
	}
}
