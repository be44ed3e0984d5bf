package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// cleanupDaemonSet is deploy/cleanup's DaemonSet.
const cleanupDaemonSet = "kube-nftproxy-cleanup"

// TestClusterFaultCleanup removes kube-nftproxy as a user would: with the
// cluster up on our proxy (image faults-a) and our tables on both nodes,
// our DaemonSet is deleted (its pods gone, the tables still there), then
// deploy/cleanup is applied with our image and the cluster's pause image;
// once its pod is Ready on every node (the init container's --cleanup
// done) no node holds a kube-nftproxy table (the sysctl record included)
// nor the conntrack timeout our init container set, and the cleanup
// DaemonSet is deleted. Each step logs its time.
func TestClusterFaultCleanup(t *testing.T) {
	l, imgs := faultsCluster(t, ProxyOurs)
	ctx, cancel := testContext(t)
	defer cancel()
	if err := l.waitOurTables(ctx, true); err != nil {
		t.Fatalf("before the delete: %v", err)
	}
	start := time.Now()
	if err := l.deleteDaemonSet(ctx, "kube-nftproxy"); err != nil {
		t.Fatal(err)
	}
	t.Logf("our DaemonSet deleted, its pods gone in %v", time.Since(start).Round(100*time.Millisecond))
	// The proxy leaves its rules when it stops (traffic keeps flowing
	// through a restart), so they are the cleanup's to remove.
	if err := l.checkOurTables(ctx, true); err != nil {
		t.Fatalf("after the delete, before the cleanup: %v", err)
	}
	cached, err := ReadImages(l.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	pause := FindImage(cached, "pause")
	if pause == "" {
		t.Fatalf("no pause image in %s", l.ImagesDir())
	}
	manifests, err := CleanupManifests(deployDir(), imgs.a.Ref, pause)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := l.apply(ctx, "cleanup", manifests); err != nil {
		t.Fatal(err)
	}
	if _, err := l.waitProxyPods(ctx, cleanupDaemonSet, nil, pause); err != nil {
		l.logCleanupPods(ctx, t)
		t.Fatalf("cleanup pods Ready on every node: %v", err)
	}
	t.Logf("cleanup pods Ready on %d nodes in %v", len(l.Nodes), time.Since(start).Round(100*time.Millisecond))
	l.logCleanupPods(ctx, t)
	if err := l.checkOurTables(ctx, false); err != nil {
		t.Error(err)
	}
	for _, n := range l.Nodes {
		// deploy/ sets kube-proxy's 24 h; a node's namespace starts with
		// the kernel's 5 days.
		const key = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
		out, err := output(ctx, nsenter(n.Name, "cat", key)...)
		if v := strings.TrimSpace(out); err != nil || v == "86400" {
			t.Errorf("%s: %s = %q (%v) after the cleanup, want it put back", n.Name, key, v, err)
		}
	}
	start = time.Now()
	if err := l.deleteDaemonSet(ctx, cleanupDaemonSet); err != nil {
		t.Fatal(err)
	}
	t.Logf("cleanup DaemonSet deleted, its pods gone in %v", time.Since(start).Round(100*time.Millisecond))
}

// ourTables are the nftables tables of kube-nftproxy (either mode's, and
// the instance lock) in node n's network namespace, as `nft list tables`
// prints them.
func (l Layout) ourTables(ctx context.Context, n Node) ([]string, error) {
	out, err := output(ctx, nsenter(n.Name, "nft", "list", "tables")...)
	if err != nil {
		return nil, err
	}
	var ours []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" && strings.HasPrefix(f[2], "kube-nftproxy") {
			ours = append(ours, f[1]+" "+f[2])
		}
	}
	return ours, nil
}

// checkOurTables says whether every node holds kube-nftproxy tables
// (present) or none does (!present).
func (l Layout) checkOurTables(ctx context.Context, present bool) error {
	for _, n := range l.Nodes {
		ours, err := l.ourTables(ctx, n)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", n.Name, err)
		case present && len(ours) == 0:
			return fmt.Errorf("%s holds no kube-nftproxy table", n.Name)
		case !present && len(ours) > 0:
			return fmt.Errorf("%s still holds %v", n.Name, ours)
		}
	}
	return nil
}

// waitOurTables waits until checkOurTables holds: our pods are Ready once
// their first sync is in, so this rarely waits.
func (l Layout) waitOurTables(ctx context.Context, present bool) error {
	var last error
	err := poll(ctx, time.Minute, func() (bool, error) {
		last = l.checkOurTables(ctx, present)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return nil
}

// deleteDaemonSet deletes kube-system DaemonSet ds and waits until none of
// its pods is left (each pod's containers stopped).
func (l Layout) deleteDaemonSet(ctx context.Context, ds string) error {
	if _, err := l.kubectl(ctx, "-n", "kube-system", "delete", "daemonset", ds, "--cascade=foreground", "--wait=false"); err != nil {
		return err
	}
	return poll(ctx, 3*time.Minute, func() (bool, error) {
		pods, err := l.proxyPods(ctx, ds)
		return err == nil && len(pods) == 0, nil
	})
}

// logCleanupPods logs the cleanup pods' state and their init containers'
// output (what --cleanup removed, or why it failed).
func (l Layout) logCleanupPods(ctx context.Context, t *testing.T) {
	sel := "app.kubernetes.io/name=" + cleanupDaemonSet
	if out, err := l.kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", sel, "-o", "wide"); err == nil {
		t.Logf("cleanup pods:\n%s", out)
	}
	if out, err := l.kubectl(ctx, "-n", "kube-system", "logs", "-l", sel, "-c", "cleanup", "--prefix"); err == nil {
		t.Logf("--cleanup's output:\n%s", out)
	}
}
