package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDownRemovesEverything builds what a running cluster leaves around
// (a daemon in a node's namespace, a "pod" process in a node's cgroups,
// stacked volume mounts under the kubelet root, a mount under the
// containerd state directory) and checks that Down removes all of it and
// reports nothing left.
func TestDownRemovesEverything(t *testing.T) {
	l := rootLayout(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { _ = l.Down(context.Background(), t.Logf) })
	if err := l.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	forgetGlobalPaths(t, l)
	n := l.Nodes[0]
	d, err := l.startDaemon("kubelet-"+n.Name, n.Name, []string{"sleep", "1000"})
	if err != nil {
		t.Fatal(err)
	}
	pod := exec.Command("sleep", "1000")
	if err := pod.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = pod.Wait() }()
	v1, _, _ := cgroupHierarchies()
	for _, h := range v1 {
		procs := filepath.Join(h, n.Name, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pod.Process.Pid)), 0o644); err != nil {
			t.Fatalf("%s: %v", procs, err)
		}
	}
	vol := filepath.Join(l.kubeletRoot(n), "pods", "uid", "volumes", "token")
	netnsMount := filepath.Join(l.ContainerdState(n), "netns", "cni-x")
	for _, m := range []string{vol, vol, netnsMount} { // vol twice: stacked
		if err := os.MkdirAll(m, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount %s: %v", m, err)
		}
	}
	if err := l.Down(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{d.pid, pod.Process.Pid} {
		if alive(p) {
			t.Errorf("process %d still alive", p)
		}
	}
	if left := l.leftovers(""); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if _, err := os.Stat(l.ContainerdState(n)); err == nil {
		t.Errorf("%s left behind", l.ContainerdState(n))
	}
}
