package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The faults' workloads: two agnhost netexec backends on the second node
// behind one NodePort Service (TCP 80 and UDP 81), and a client pod on the
// first node whose network namespace the requests come from.
const (
	faultsNS       = "knp-faults"
	faultsTCPPort  = 30280
	faultsUDPPort  = 30281
	faultsRelA     = "faults-a" // the release stamped into each of two builds
	faultsRelB     = "faults-b"
	faultsImageA   = "docker.io/library/kube-nftproxy:" + faultsRelA
	faultsImageB   = "docker.io/library/kube-nftproxy:" + faultsRelB
	faultsDeletes  = 10
	faultsSettling = 3 * time.Second  // traffic measured after the last change
	faultsBaseline = 20 * time.Second // traffic measured with no fault, for comparison
	// faultsExternalIP is Service echo-local's external IP: on the node
	// network's subnet but no node's, routed to node2 from the node network.
	faultsExternalIP = "10.200.0.250"
)

// TestClusterFaultRestarts brings the cluster up with kube-nftproxy built
// from this tree (image faults-a) and, with the client pod on node1
// sending TCP and UDP requests to the ClusterIP, node1's NodePort and
// node2's NodePort (backends on node2) and the long-lived flows held open
// (faults_flows_test.go), runs each fault in turn: our DaemonSet pods
// deleted on both nodes ten times (each time waiting for both replacements
// to be Ready), the DaemonSet rolled to another build (faults-b), an
// unrelated Service's endpoint removed, a port added to the Service, each
// kubelet restarted, the API server restarted, etcd restarted; a baseline
// with no fault comes first, for comparison. Each fault prints one FAULT
// and one FLOWS line; any failed request or exchange fails the test.
func TestClusterFaultRestarts(t *testing.T) {
	l, imgs := faultsCluster(t, ProxyOurs)
	ctx, cancel := testContext(t)
	defer cancel()
	r := l.faultsWorkloads(ctx, t)
	defer r.finish(t)
	for _, f := range []struct {
		name  string
		fault func() error
	}{
		{"baseline", func() error { return wait(ctx, faultsBaseline) }},
		{"delete-pod", func() error { return l.deleteProxyPods(ctx, t) }},
		{"roll-image", func() error { return l.rollProxy(ctx, t, imgs.b) }},
		{"unrelated-endpoint-removed", func() error { return l.removeUnrelatedEndpoint(ctx) }},
		{"port-added", func() error { return r.addPort(ctx, t) }},
		{"kubelet-restart", func() error { return l.restartKubelets(ctx, t) }},
		{"apiserver-restart", func() error { return l.restartAPIServer(ctx, t) }},
		{"etcd-restart", func() error { return l.restartEtcd(ctx, t) }},
	} {
		t.Run(f.name, func(t *testing.T) { r.measure(ctx, t, "cluster-"+f.name, f.fault) })
	}
}

// faultImages are the two builds' archives, and build A's binary.
type faultImages struct {
	a, b Image
	binA string
}

// faultsCluster skips unless asked and possible, builds the two images,
// brings the cluster up with the given proxy and registers its teardown.
func faultsCluster(t *testing.T, proxy string) (Layout, faultImages) {
	if os.Getenv("KNP_CLUSTER_FAULTS") != "1" {
		t.Skip("the cluster faults run with KNP_CLUSTER_FAULTS=1 (make cluster-faults)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: brings up a two-node Kubernetes cluster in network namespaces")
	}
	l := DefaultLayout()
	l.Proxy = proxy
	if missing := l.coldCache(); len(missing) > 0 {
		t.Skipf("cluster cache is cold, missing %s: run `make cluster-build cluster-images`", groupByDir(missing))
	}
	if up := l.alreadyUp(); up != "" {
		t.Skipf("a cluster is already up (%s): not clobbering it; `make cluster-down` frees the machine", up)
	}
	imgs, dir := buildFaultImages(t, l)
	l.Images = dir
	ctx, cancel := testContext(t)
	defer cancel()
	start := time.Now()
	t.Cleanup(func() {
		if err := l.Down(context.Background(), t.Logf); err != nil {
			t.Errorf("cluster down: %v", err)
		}
		t.Logf("whole test %v", time.Since(start).Round(100*time.Millisecond))
	})
	if err := l.Up(ctx, deployDir(), t.Logf); err != nil {
		t.Fatalf("cluster up: %v (logs in %s/logs)", err, l.Dir)
	}
	t.Logf("cluster up (%s) in %v", l.proxyName(), time.Since(start).Round(100*time.Millisecond))
	return l, imgs
}

// wait waits d, or until ctx ends: a measuring window, not a
// synchronization.
func wait(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func deployDir() string { return filepath.Join("..", "..", "deploy") }

// buildFaultImages builds kube-nftproxy from this tree twice, stamped with
// different releases, as make image's static binary on an empty
// image (hack/cluster/images' tool), and writes an images directory
// that holds the cache's images but for kube-nftproxy, which is build A.
// Build B is only imported when the DaemonSet rolls to it.
func buildFaultImages(t *testing.T, l Layout) (faultImages, string) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "cluster-images")
	goBuild(t, filepath.Join("..", "..", "hack", "cluster", "images"), []string{"GOWORK=off", "GOFLAGS=-mod=mod"}, "-o", tool, ".")
	var imgs faultImages
	for _, b := range []struct {
		rel, ref string
		into     *Image
	}{{faultsRelA, faultsImageA, &imgs.a}, {faultsRelB, faultsImageB, &imgs.b}} {
		bin := filepath.Join(dir, "kube-nftproxy-"+b.rel)
		goBuild(t, filepath.Join("..", ".."), []string{"CGO_ENABLED=0"}, "-trimpath", "-buildvcs=false",
			"-ldflags", "-s -X main.release="+b.rel+" -X main.commit=faults", "-o", bin, "./cmd/kube-nftproxy")
		archive := filepath.Join(dir, "kube-nftproxy-"+b.rel+".tar")
		cmd := exec.Command(tool, "build", "-out", archive, "-ref", b.ref,
			"-file", "/kube-nftproxy="+bin, "-symlink", "/usr/local/bin/kube-proxy=/kube-nftproxy",
			"-entrypoint", `["/kube-nftproxy"]`)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("image %s: %v: %s", b.ref, err, out)
		}
		*b.into = Image{Ref: b.ref, File: archive}
		if imgs.binA == "" {
			imgs.binA = bin
		}
	}
	cached, err := ReadImages(l.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{imgs.a.Ref + " " + filepath.Base(imgs.a.File)}
	for _, im := range cached {
		if FindImage([]Image{im}, "kube-nftproxy") != "" {
			continue
		}
		link := filepath.Join(dir, filepath.Base(im.File))
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(im.File, link); err != nil {
				t.Fatal(err)
			}
		}
		lines = append(lines, im.Ref+" "+filepath.Base(im.File))
	}
	if err := os.WriteFile(filepath.Join(dir, "images.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return imgs, dir
}

func goBuild(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v in %s: %v: %s", args, dir, err, out)
	}
	t.Logf("go build %s in %v", args[len(args)-1], time.Since(start).Round(100*time.Millisecond))
}
