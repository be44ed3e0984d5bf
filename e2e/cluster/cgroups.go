package cluster

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// cgroupHierarchies lists the mount points of the cgroup hierarchies
// (every v1 hierarchy, and the v2 one of a hybrid setup).
func cgroupHierarchies() (v1, all []string, err error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		switch fields[2] {
		case "cgroup":
			v1 = append(v1, fields[1])
			all = append(all, fields[1])
		case "cgroup2":
			all = append(all, fields[1])
		}
	}
	return v1, all, sc.Err()
}

// createCgroupRoots creates /<node> where kubelet's cgroupRoot must exist:
// in every v1 hierarchy (with the root's CPUs and memory nodes in the
// cpuset one: a new cpuset starts empty) or, on a host with cgroup v2 alone
// (a VM's kernel), in the unified hierarchy with its controllers delegated.
func (l Layout) createCgroupRoots() error {
	v1, all, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	if len(v1) == 0 && len(all) == 1 {
		return l.createUnifiedCgroupRoots(all[0])
	}
	for _, n := range l.Nodes {
		for _, h := range v1 {
			dir := filepath.Join(h, n.Name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					continue // not the cpuset hierarchy
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// createUnifiedCgroupRoots creates /<node> in the cgroup v2 hierarchy at
// root and enables every controller the root has in it and in its parent,
// so that kubelet can limit the pods below it.
func (l Layout) createUnifiedCgroupRoots(root string) error {
	ctrls, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2 controllers: %w", err)
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrls)) {
		enable = append(enable, "+"+c)
	}
	delegate := func(dir string) error {
		f := filepath.Join(dir, "cgroup.subtree_control")
		if err := os.WriteFile(f, []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: %w", f, err)
		}
		return nil
	}
	if err := delegate(root); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		dir := filepath.Join(root, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if err := delegate(dir); err != nil {
			return err
		}
	}
	return nil
}

// cgroupDirs lists the cluster's cgroup directories (/<node> and
// everything below it, in every hierarchy), deepest first.
func (l Layout) cgroupDirs() ([]string, error) {
	_, all, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, n := range l.Nodes {
		for _, h := range all {
			root := filepath.Join(h, n.Name)
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs, nil
}

// inClusterCgroup reports whether a /proc/<pid>/cgroup text places the
// process under one of the nodes' cgroup roots.
func (l Layout) inClusterCgroup(procCgroup string) bool {
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, n := range l.Nodes {
			if parts[2] == "/"+n.Name || strings.HasPrefix(parts[2], "/"+n.Name+"/") {
				return true
			}
		}
	}
	return false
}
