package cluster

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestSplitSeedImages(t *testing.T) {
	imgs := []Image{
		{Ref: "registry.k8s.io/pause:3.10.2", File: "/c/pause.tar"},
		{Ref: "registry.local/kube-nftproxy:v1-g1", File: "/c/kube-nftproxy.tar"},
		{Ref: "docker.io/library/kube-nftproxy:dev", File: "/c/kube-nftproxy.tar"},
		{Ref: "registry.k8s.io/e2e-test-images/agnhost:2.55", File: "/c/agnhost.tar"},
		{Ref: "registry.k8s.io/kube-proxy:v1.37.1", File: "/c/kube-proxy.tar"},
	}
	seeded, rest := splitSeedImages(imgs)
	files := func(imgs []Image) []string {
		var out []string
		for _, im := range imgs {
			out = append(out, filepath.Base(im.File))
		}
		return out
	}
	if got, want := files(seeded), []string{"pause.tar", "agnhost.tar", "kube-proxy.tar"}; !slices.Equal(got, want) {
		t.Errorf("seeded %v, want %v", got, want)
	}
	if got, want := files(rest), []string{"kube-nftproxy.tar", "kube-nftproxy.tar"}; !slices.Equal(got, want) {
		t.Errorf("imported at each start %v, want %v (every reference of our archive)", got, want)
	}
}

// TestLinkSeed: a node's root shares the seed's snapshot and content files
// (one inode) but has copies of the databases containerd writes.
func TestLinkSeed(t *testing.T) {
	seed := filepath.Join(t.TempDir(), "root")
	files := map[string]string{
		"io.containerd.metadata.v1.bolt/meta.db":                          "meta",
		"io.containerd.snapshotter.v1.overlayfs/metadata.db":              "snap",
		"io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/etc/x.db":  "in an image",
		"io.containerd.content.v1.content/blobs/sha256/0123456789abcdef0": "blob",
		seedInstanceFile: "seed's uuid",
	}
	for name, text := range files {
		p := filepath.Join(seed, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sticky := filepath.Join(seed, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/tmp")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o1777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "node1", "containerd")
	if err := os.MkdirAll(root, 0o755); err != nil { // what prepare leaves
		t.Fatal(err)
	}
	if err := linkSeed(t.Context(), seed, root); err != nil {
		t.Fatal(err)
	}
	copied := map[string]bool{
		"io.containerd.metadata.v1.bolt/meta.db":             true,
		"io.containerd.snapshotter.v1.overlayfs/metadata.db": true,
	}
	if _, err := os.Stat(filepath.Join(root, seedInstanceFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the node's root has the seed's %s (%v): each containerd makes its own", seedInstanceFile, err)
	}
	delete(files, seedInstanceFile)
	for name, text := range files {
		a, b := filepath.Join(seed, name), filepath.Join(root, name)
		data, err := os.ReadFile(b)
		if err != nil || string(data) != text {
			t.Errorf("%s: %q, %v; want %q", name, data, err, text)
			continue
		}
		if linked := sameInode(t, a, b); linked == copied[name] {
			t.Errorf("%s: hard link %v, want %v", name, linked, !copied[name])
		}
	}
	st, err := os.Stat(filepath.Join(root, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/tmp"))
	if err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("a directory's mode was not kept: %v, %v", st.Mode(), err)
	}
}

func sameInode(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestPruneSeeds(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"0123456789abcdef", "fedcba9876543210.tmp-12", "fedcba9876543210.tmp-34"} {
		if err := os.MkdirAll(filepath.Join(dir, name, "root"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	keep := filepath.Join(dir, "fedcba9876543210.tmp-34")
	if err := pruneSeeds(dir, keep); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(dir)
	if err != nil || len(left) != 1 || left[0].Name() != filepath.Base(keep) {
		t.Errorf("left %v (%v), want only the seed being made", left, err)
	}
	if err := pruneSeeds(filepath.Join(dir, "absent"), ""); err != nil {
		t.Errorf("no seeds directory yet: %v", err)
	}
}

func TestLinkable(t *testing.T) {
	seed := t.TempDir()
	db := filepath.Join(seed, "io.containerd.metadata.v1.bolt", "meta.db")
	if err := os.MkdirAll(filepath.Dir(db), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db, []byte("meta"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := linkable(seed, dir); err != nil {
		t.Errorf("a seed on the same filesystem: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the probe left %v behind", left)
	}
	if err := linkable(filepath.Join(seed, "absent"), dir); err == nil {
		t.Error("a seed without its database: no error")
	}
}
