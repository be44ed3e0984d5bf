package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// globalPaths are directories outside Dir that kubelet, containerd, the
// CNI plugins and flanneld create whatever their configuration says. Up
// records which of them it found missing (createdFile); Down removes those.
var globalPaths = []string{
	"/var/lib/cni", "/run/containerd", "/opt/containerd", "/var/lib/kubelet",
	"/run/flannel", "/etc/cni", "/var/log/containers", "/var/log/pods", "/run/nri",
}

const createdFile = "created-paths"

// recordGlobalPaths notes which globalPaths do not exist yet.
func (l Layout) recordGlobalPaths() error {
	var missing []string
	for _, p := range globalPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, p)
		}
	}
	return os.WriteFile(filepath.Join(l.Dir, createdFile), []byte(strings.Join(missing, "\n")+"\n"), 0o644)
}

// Down stops and removes everything Up created, then checks that nothing
// is left: processes, mounts, network namespaces, cgroups, directories.
func (l Layout) Down(ctx context.Context, logf func(string, ...any)) error {
	l = l.withRecordedNodes()
	created, _ := os.ReadFile(filepath.Join(l.Dir, createdFile))
	sysctls, _ := os.ReadFile(filepath.Join(l.Dir, sysctlFile))
	// Guests first (vmnode.go): their nodes go with them.
	for _, n := range l.Nodes {
		if err := l.stopDaemon("vm-"+n.Name, 20*time.Second); err != nil {
			logf("%v", err)
		}
	}
	// kubelets first, so that none restarts a container being killed.
	for _, n := range l.Nodes {
		if err := l.stopDaemon("kubelet-"+n.Name, 10*time.Second); err != nil {
			logf("%v", err)
		}
	}
	l.killStragglers(true, logf) // the pods' processes
	var names []string
	for _, n := range l.Nodes {
		names = append(names, "containerd-"+n.Name)
	}
	names = append(names, "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
	for _, name := range names {
		if err := l.stopDaemon(name, 10*time.Second); err != nil {
			logf("%v", err)
		}
	}
	l.killStragglers(false, logf) // shims, anything else in the namespaces
	for _, err := range l.unmountAll() {
		logf("%v", err)
	}
	for _, err := range l.deleteNetwork(ctx) {
		logf("%v", err)
	}
	l.removeCgroups(logf)
	for _, err := range restoreSysctls(string(sysctls)) {
		logf("%v", err)
	}
	for _, d := range l.ownedDirs(string(created)) {
		if err := os.RemoveAll(d); err != nil {
			logf("remove %s: %v", d, err)
		}
	}
	left := l.leftovers(string(created))
	if len(left) > 0 {
		return fmt.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
	}
	return nil
}

// ownedDirs are the directories Down removes: Dir, each node's containerd
// state, and the globalPaths Up found missing.
func (l Layout) ownedDirs(created string) []string {
	dirs := []string{l.Dir}
	for _, n := range l.Nodes {
		dirs = append(dirs, l.ContainerdState(n))
	}
	return append(dirs, strings.Fields(created)...)
}

// clusterProcesses lists the processes in the cluster's network
// namespaces or cgroups (daemons, shims, pods), but not this one; with
// podsOnly, only those in the cgroups (the containers).
func (l Layout) clusterProcesses(podsOnly bool) []int {
	inodes := map[string]bool{}
	for _, ns := range l.netnsNames() {
		var st syscall.Stat_t
		if err := syscall.Stat(NetNSPath(ns), &st); err == nil {
			inodes[fmt.Sprintf("net:[%d]", st.Ino)] = true
		}
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !alive(pid) {
			continue
		}
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if (!podsOnly && inodes[link]) || l.inClusterCgroup(string(cg)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killStragglers SIGKILLs every cluster process and waits for them.
func (l Layout) killStragglers(podsOnly bool, logf func(string, ...any)) {
	for round := 0; round < 5; round++ {
		pids := l.clusterProcesses(podsOnly)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if waitGone(pids, 10*time.Second) {
			continue
		}
		logf("processes still alive after SIGKILL: %v", pids)
	}
}

// unmountRoots are the trees whose mounts belong to the cluster.
func (l Layout) unmountRoots() []string {
	roots := []string{l.Dir, "/run/containerd", "/var/lib/kubelet"}
	for _, n := range l.Nodes {
		roots = append(roots, l.ContainerdState(n))
	}
	return roots
}

// clusterMounts lists the mount points under unmountRoots, deepest first.
func (l Layout) clusterMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, r := range l.unmountRoots() {
			if mp == r || strings.HasPrefix(mp, r+"/") {
				mounts = append(mounts, mp)
				break
			}
		}
	}
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount under the cluster's roots (volumes,
// overlay root file systems, sandbox network namespaces, shm), repeating
// while mounts stacked on each other remain.
func (l Layout) unmountAll() []error {
	var errs []error
	for round := 0; round < 5; round++ {
		mounts, err := l.clusterMounts()
		if err != nil {
			return []error{err}
		}
		if len(mounts) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errs
}

// removeCgroups removes the nodes' cgroup trees, deepest first.
func (l Layout) removeCgroups(logf func(string, ...any)) {
	dirs, err := l.cgroupDirs()
	if err != nil {
		logf("cgroups: %v", err)
		return
	}
	for _, d := range dirs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				logf("remove cgroup %s: %v", d, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// leftovers describes whatever of the cluster still exists.
func (l Layout) leftovers(created string) []string {
	var left []string
	for _, p := range l.clusterProcesses(false) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		left = append(left, fmt.Sprintf("process %d: %s", p, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	mounts, _ := l.clusterMounts()
	for _, m := range mounts {
		left = append(left, "mount "+m)
	}
	for _, ns := range l.netnsNames() {
		if _, err := os.Lstat(NetNSPath(ns)); err == nil {
			left = append(left, "network namespace "+ns)
		}
	}
	dirs, _ := l.cgroupDirs()
	for _, d := range dirs {
		left = append(left, "cgroup "+d)
	}
	for _, d := range l.ownedDirs(created) {
		if _, err := os.Lstat(d); err == nil {
			left = append(left, "directory "+d)
		}
	}
	return left
}
