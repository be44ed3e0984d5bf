package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

// On a kernel with cgroup v2 alone (the VM cluster's), every node gets its
// cgroup root with the root's controllers delegated down to it: without
// them kubelet cannot create its pod cgroups with limits.
func TestUnifiedCgroupRootsDelegateControllers(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := Layout{Nodes: []Node{{Name: "node1"}, {Name: "node2"}}}
	if err := l.createUnifiedCgroupRoots(root); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Join(root, "node1"), filepath.Join(root, "node2")} {
		got, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil {
			t.Fatal(err)
		}
		if want := "+cpu +io +memory +pids"; string(got) != want {
			t.Errorf("%s/cgroup.subtree_control = %q, want %q", dir, got, want)
		}
	}
}

func TestUnifiedCgroupRootsNeedControllers(t *testing.T) {
	l := Layout{Nodes: []Node{{Name: "node1"}}}
	if err := l.createUnifiedCgroupRoots(t.TempDir()); err == nil {
		t.Error("no cgroup.controllers: no error")
	}
}
