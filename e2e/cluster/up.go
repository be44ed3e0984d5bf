package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Up brings the cluster up from nothing, printing progress through logf,
// and leaves it running. deployDir is the repository's deploy/.
func (l Layout) Up(ctx context.Context, deployDir string, logf func(string, ...any)) error {
	if err := l.checkProxy(); err != nil {
		return err
	}
	if err := l.checkKernel(ipvsProcFile); err != nil {
		return err
	}
	if err := l.checkFamily(); err != nil {
		return err
	}
	if l.NodesErr != nil {
		return l.NodesErr
	}
	if err := l.checkLB(); err != nil {
		return err
	}
	if err := l.checkBinaries(); err != nil {
		return err
	}
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		return fmt.Errorf("images (run hack/cluster/images.sh): %w", err)
	}
	refs, err := l.requiredImages(imgs)
	if err != nil {
		return err
	}
	lbRefs, err := l.loadBalancerImages(imgs)
	if err != nil {
		return err
	}
	if _, err := os.Stat(l.Dir); err == nil {
		return fmt.Errorf("%s exists: run `make cluster-down` first", l.Dir)
	}
	if err := l.prepare(ctx); err != nil {
		return err
	}
	logf("node network and cgroups ready")
	if err := l.startControlPlane(ctx); err != nil {
		return err
	}
	logf("control plane ready at %s", l.APIServerURL())
	if err := l.bringUpNodes(ctx, deployDir, imgs, refs, logf); err != nil {
		return err
	}
	cidrs, err := l.waitPodCIDRs(ctx)
	if err != nil {
		return err
	}
	logf("nodes registered, pod CIDRs %v", joinValues(cidrs))
	if err := l.setupPodNetwork(ctx, refs, cidrs, logf); err != nil {
		return err
	}
	if err := l.deployAddons(ctx, deployDir, refs); err != nil {
		return err
	}
	if err := l.waitNodesReady(ctx, logf); err != nil {
		return err
	}
	if err := l.waitDaemonSet(ctx, l.proxyName(), logf); err != nil {
		return err
	}
	// A patched DaemonSet (ProxyPrivileged) may have replaced its first pods.
	if err := l.waitRollout(ctx, "kube-system", "daemonset/"+l.proxyName()); err != nil {
		return err
	}
	if refs.coredns == "" {
		return errors.New("cluster up without CoreDNS: images.txt has no coredns image (hack/cluster/images.sh)")
	}
	if err := l.waitRollout(ctx, "kube-system", "deployment/coredns"); err != nil {
		return err
	}
	logf("CoreDNS available")
	return l.deployLoadBalancer(ctx, lbRefs, logf)
}

// bringUpNodes starts the nodes (in guests with VMNodes, which check
// their images themselves) and checks that each has every image.
func (l Layout) bringUpNodes(ctx context.Context, deployDir string, imgs []Image, refs imageRefs, logf func(string, ...any)) error {
	if l.VMNodes() {
		repo, err := filepath.Abs(filepath.Join(deployDir, ".."))
		if err != nil {
			return err
		}
		return l.startVMNodes(ctx, repo, refs, logf)
	}
	seed, rest, err := l.imageSeed(ctx, imgs, logf)
	if err == nil {
		err = linkable(seed, l.Dir)
	}
	if err != nil {
		logf("%v: every node imports every archive", err)
		seed, rest = "", l.nodeImages(imgs)
	}
	if err := l.startNodes(ctx, seed, rest, logf); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		missing, err := l.missingImages(ctx, n, []string{refs.pause, refs.proxy, refs.coredns, refs.agnhost, refs.flannel})
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			return fmt.Errorf("%s lacks %v after the import: did images.txt change meanwhile (hack/cluster/images.sh running)?", n.Name, missing)
		}
	}
	return nil
}

// joinValues shows each node's pod CIDRs comma-separated.
func joinValues(m map[string][]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = strings.Join(v, ",")
	}
	return out
}

// checkBinaries says which of the contract's binaries are missing.
func (l Layout) checkBinaries() error {
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		if !executable(l.K8sBin(b)) {
			missing = append(missing, l.K8sBin(b))
		}
	}
	for _, b := range []string{l.etcdBin(), l.containerdBin(), runcPath(), filepath.Join(l.CNIBinDir(), "bridge")} {
		if !executable(b) {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing binaries (run hack/cluster/build.sh): %s", strings.Join(missing, ", "))
	}
	// The CNI portmap plugin (hostPort) runs the node's iptables; without
	// it every pod with a hostPort stays ContainerCreating.
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("no iptables on PATH (apt-get install iptables): the CNI portmap plugin runs it for pods with a hostPort: %w", err)
	}
	return nil
}

func (l Layout) etcdBin() string {
	if executable(l.ClusterBin("etcd")) {
		return l.ClusterBin("etcd")
	}
	return "/usr/bin/etcd"
}

func (l Layout) containerdBin() string {
	if executable(l.ClusterBin("containerd")) {
		return l.ClusterBin("containerd")
	}
	return "/usr/bin/containerd"
}

// KubectlBin is the contract's kubectl, else the one on PATH.
func (l Layout) KubectlBin() string {
	if executable(l.K8sBin("kubectl")) {
		return l.K8sBin("kubectl")
	}
	return "kubectl"
}

// imageRefs are the images the cluster runs, by role.
type imageRefs struct {
	pause, coredns, proxy, agnhost, flannel string
}

func (l Layout) requiredImages(imgs []Image) (imageRefs, error) {
	r := imageRefs{
		pause: FindImage(imgs, "pause"), coredns: FindImage(imgs, "coredns"),
		proxy: FindImage(imgs, l.proxyImage()), agnhost: FindImage(imgs, "agnhost"),
		flannel: FindImage(imgs, "flannel"),
	}
	var missing []string
	for name, ref := range map[string]string{"pause": r.pause, l.proxyImage(): r.proxy} {
		if ref == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return r, fmt.Errorf("images.txt lacks %s (run hack/cluster/images.sh)", strings.Join(missing, ", "))
	}
	if r.pause != PauseImage {
		return r, fmt.Errorf("pause image is %s, want %s", r.pause, PauseImage)
	}
	return r, nil
}

// prepare writes certificates, kubeconfigs and node configurations, and
// creates the namespaces and cgroup roots.
func (l Layout) prepare(ctx context.Context) error {
	if err := os.MkdirAll(l.Dir, 0o755); err != nil {
		return err
	}
	if err := l.recordGlobalPaths(); err != nil {
		return err
	}
	if err := l.recordNodes(); err != nil {
		return err
	}
	if err := l.saveSysctls(); err != nil {
		return err
	}
	if err := l.writePKI(); err != nil {
		return err
	}
	files := map[string]string{l.Kubeconfig(): l.kubeconfig(l.APIServerURL(), "admin")}
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		files[l.kubeconfigFor(c)] = l.kubeconfig(l.APIServerURL(), c)
	}
	major := containerdMajor(ctx, l.containerdBin())
	for _, n := range l.Nodes {
		files[l.kubeconfigFor("kubelet-"+n.Name)] = l.kubeconfig(l.APIServerURL(), "kubelet-"+n.Name)
		files[l.nodeFile(n, "kubelet.yaml")] = l.KubeletConfig(n)
		files[l.nodeFile(n, "containerd.toml")] = l.ContainerdConfig(n, major)
		files[l.resolvConf(n)] = l.resolvConfText()
		for _, d := range []string{l.kubeletRoot(n), l.podLogsDir(n), l.cniConfDir(n), l.containerdRoot(n)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			return err
		}
	}
	if err := l.setupNetwork(ctx); err != nil {
		return err
	}
	if l.VMNodes() {
		return nil // each guest creates its own
	}
	return l.createCgroupRoots()
}

// containerdMajor is the major version `containerd --version` prints.
func containerdMajor(ctx context.Context, bin string) int {
	out, err := output(ctx, bin, "--version")
	if err != nil {
		return 1
	}
	return parseContainerdMajor(out)
}

func parseContainerdMajor(out string) int {
	for _, f := range strings.Fields(out) {
		f = strings.TrimPrefix(f, "v")
		if len(f) > 1 && f[0] >= '1' && f[0] <= '9' && f[1] == '.' {
			return int(f[0] - '0')
		}
	}
	return 1
}

// startControlPlane starts etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler in the node network's namespace.
func (l Layout) startControlPlane(ctx context.Context) error {
	args := l.controlPlaneArgs(l.etcdBin())
	etcd, err := l.startDaemon("etcd", l.NodeNet, args["etcd"])
	if err != nil {
		return err
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		if etcd.exited() {
			return false, errors.New("etcd exited: see " + l.logFile("etcd"))
		}
		out, _ := output(ctx, nsenter(l.NodeNet, "curl", "-s", "--noproxy", "*", fmt.Sprintf("http://127.0.0.1:%d/health", etcdClientPort))...)
		return strings.Contains(out, `"health":"true"`), nil
	})
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	api, err := l.startDaemon("kube-apiserver", l.NodeNet, args["kube-apiserver"])
	if err != nil {
		return err
	}
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		if api.exited() {
			return false, errors.New("kube-apiserver exited: see " + l.logFile("kube-apiserver"))
		}
		out, _ := l.kubectl(ctx, "get", "--raw", "/readyz")
		return strings.TrimSpace(out) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := l.startDaemon(c, l.NodeNet, args[c]); err != nil {
			return err
		}
	}
	return nil
}

// startNodes starts each node's containerd on a root linked to the image
// seed (none: an empty root), imports the other images into it, and
// starts its kubelet.
func (l Layout) startNodes(ctx context.Context, seed string, imgs []Image, logf func(string, ...any)) error {
	errs := make(chan error, len(l.Nodes))
	for _, n := range l.Nodes {
		go func() { errs <- l.startNode(ctx, n, seed, imgs, logf) }()
	}
	var all []error
	for range l.Nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

func (l Layout) startNode(ctx context.Context, n Node, seed string, imgs []Image, logf func(string, ...any)) error {
	if seed != "" {
		if err := linkSeed(ctx, seed, l.containerdRoot(n)); err != nil {
			return fmt.Errorf("%s: the image seed: %w", n.Name, err)
		}
	}
	cd, err := l.startDaemon("containerd-"+n.Name, n.Name,
		[]string{l.containerdBin(), "--config", l.nodeFile(n, "containerd.toml")})
	if err != nil {
		return err
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		if cd.exited() {
			return false, fmt.Errorf("containerd of %s exited: see %s", n.Name, l.logFile("containerd-"+n.Name))
		}
		return run(ctx, l.ctrBin(), "--address", l.ContainerdSocket(n), "version") == nil, nil
	})
	if err != nil {
		return err
	}
	start := time.Now()
	count, err := l.importImages(ctx, n, imgs)
	if err != nil {
		return err
	}
	logf("%s: %d image archives imported in %v (seed: %s)", n.Name, count, time.Since(start).Round(100*time.Millisecond), cmp.Or(seed, "none"))
	_, err = l.startDaemon("kubelet-"+n.Name, n.Name, append([]string{l.K8sBin("kubelet")}, l.KubeletArgs(n)...))
	return err
}

// kubectl runs kubectl as admin inside the node network.
func (l Layout) kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{l.KubectlBin(), "--kubeconfig=" + l.Kubeconfig()}, args...)
	return output(ctx, nsenter(l.NodeNet, argv...)...)
}

// apply writes manifests to manifests/<name>.yaml and applies them.
func (l Layout) apply(ctx context.Context, name, manifests string) error {
	dir := filepath.Join(l.Dir, "manifests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(manifests), 0o644); err != nil {
		return err
	}
	if _, err := l.kubectl(ctx, "apply", "-f", path); err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}
	return nil
}

// poll calls check until it reports done, fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := check()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not done after %v: %w", timeout, ctx.Err())
		case <-tick.C:
		}
	}
}
