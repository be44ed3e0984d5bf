package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// containerdBinaries finds containerd and ctr: the cluster's own build
// ($KNP_CACHE/cluster/bin) first, then PATH (Debian's containerd package).
func containerdBinaries() (containerd, ctr string, err error) {
	cache := os.Getenv("KNP_CACHE")
	if cache == "" {
		cache = "/var/cache/kube-nftproxy"
	}
	find := func(name string) (string, error) {
		if p := filepath.Join(cache, "cluster", "bin", name); isExecutable(p) {
			return p, nil
		}
		return exec.LookPath(name)
	}
	if containerd, err = find("containerd"); err != nil {
		return "", "", err
	}
	ctr, err = find("ctr")
	return containerd, ctr, err
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// privateContainerd starts a containerd with its own root, state and socket
// under dir (no CRI plugin: nothing else talks to it) and returns its
// socket. It is stopped when the test ends.
func privateContainerd(t *testing.T, binary, dir string) string {
	t.Helper()
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = "%s.ttrpc"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock)
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logFile.Close()
		// Snapshots may leave overlay mounts only while containers run; none do.
	})
	waitForSocket(t, sock, logFile.Name())
	return sock
}

func waitForSocket(t *testing.T, sock, logName string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(logName)
	t.Fatalf("containerd did not listen on %s within 30s; log:\n%s", sock, b)
}

// containerdTestDir skips the test without root or without containerd and
// ctr, and returns those binaries and a directory removed after the test.
func containerdTestDir(t *testing.T, prefix string) (containerd, ctr, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containerd")
	}
	containerd, ctr, err := containerdBinaries()
	if err != nil {
		t.Skipf("containerd/ctr not found (apt-get install containerd, or hack/cluster/build.sh): %v", err)
	}
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return containerd, ctr, dir
}

// privateCtr starts a private containerd under dir and returns a runner of
// ctr against it, in namespace k8s.io, that fails the test on an error.
func privateCtr(t *testing.T, containerd, ctr, dir string) func(args ...string) string {
	sock := privateContainerd(t, containerd, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return func(args ...string) string {
		full := append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)
		b, err := exec.CommandContext(ctx, ctr, full...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
}

// TestCtrImportsTheArchive builds a small image and imports it the way the
// nodes do (`ctr -n k8s.io images import`, unpacking into the overlayfs
// snapshotter), into a private containerd started for the test.
func TestCtrImportsTheArchive(t *testing.T) {
	containerd, ctr, dir := containerdTestDir(t, "knp-images-ctr-")
	out, args := smallImage(t, dir)
	if err := run(args, io.Discard, io.Discard); err != nil {
		t.Fatalf("build: %v", err)
	}
	ctrRun := privateCtr(t, containerd, ctr, dir)
	ctrRun("images", "import", out)
	listed := ctrRun("images", "list", "--quiet")
	for _, ref := range []string{"registry.k8s.io/e2e-test-images/hello:1.0", "docker.io/library/hello:dev"} {
		if !strings.Contains(listed, ref+"\n") {
			t.Errorf("after import, %s is not listed:\n%s", ref, listed)
		}
	}
	// check: every blob of the image is in the content store, unpacked.
	checked := ctrRun("images", "check")
	if strings.Count(checked, "complete") < 2 {
		t.Errorf("images check does not report both references complete:\n%s", checked)
	}
	// import unpacks into the default (overlayfs) snapshotter: the layer
	// applied, as the kubelet will need it.
	snapshots := ctrRun("snapshots", "list")
	if !strings.Contains(snapshots, "Committed") {
		t.Errorf("no committed snapshot after import (layer not unpacked):\n%s", snapshots)
	}
	t.Logf("ctr images check:\n%s", checked)
}
