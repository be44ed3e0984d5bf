package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Image is one line of images.txt: a reference and its docker archive.
type Image struct {
	Ref  string
	File string // absolute path
}

// ReadImages parses dir/images.txt ("<reference> <file name>" per line;
// blank lines and # comments skipped).
func ReadImages(dir string) ([]Image, error) {
	f, err := os.Open(filepath.Join(dir, "images.txt"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var imgs []Image
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		fields := strings.Fields(t)
		if len(fields) != 2 {
			return nil, fmt.Errorf("images.txt:%d: want \"<reference> <file>\", got %q", line, t)
		}
		imgs = append(imgs, Image{Ref: fields[0], File: filepath.Join(dir, fields[1])})
	}
	return imgs, sc.Err()
}

// FindImage returns the reference whose repository's last path element is
// name (kube-nftproxy, coredns, agnhost, pause, flannel), or "".
func FindImage(imgs []Image, name string) string {
	for _, im := range imgs {
		if imageName(im.Ref) == name {
			return im.Ref
		}
	}
	return ""
}

// imageName is a reference's last path element without tag or digest:
// "agnhost" for registry.k8s.io/e2e-test-images/agnhost:2.55.
func imageName(ref string) string {
	repo := ref
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo[strings.LastIndex(repo, "/")+1:]
}

// importImages loads every archive (once: several references may name the
// same file, which carries them all) into the node's containerd, in the
// namespace the CRI uses. It returns how many archives it imported.
func (l Layout) importImages(ctx context.Context, n Node, imgs []Image) (int, error) {
	count, err := l.importArchives(ctx, l.ContainerdSocket(n), imgs)
	if err != nil {
		return count, fmt.Errorf("%s: %w", n.Name, err)
	}
	return count, nil
}

// importArchives is importImages for the containerd at socket: a node's
// or the image seed's.
func (l Layout) importArchives(ctx context.Context, socket string, imgs []Image) (int, error) {
	done := map[string]bool{}
	for _, im := range imgs {
		if done[im.File] {
			continue
		}
		done[im.File] = true
		if err := run(ctx, l.ctrBin(), "--address", socket, "-n", "k8s.io", "images", "import", im.File); err != nil {
			return len(done), fmt.Errorf("import %s: %w", im.File, err)
		}
	}
	return len(done), nil
}

// ctrBin is the contract's ctr, else Debian's.
func (l Layout) ctrBin() string {
	if executable(l.ClusterBin("ctr")) {
		return l.ClusterBin("ctr")
	}
	return "ctr"
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// missingImages returns the references in refs that the node's containerd
// does not have (images.sh rebuilding an archive with a new tag while Up
// imports it, for instance).
func (l Layout) missingImages(ctx context.Context, n Node, refs []string) ([]string, error) {
	out, err := output(ctx, l.ctrBin(), "--address", l.ContainerdSocket(n), "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, r := range strings.Fields(out) {
		have[r] = true
	}
	var missing []string
	for _, r := range refs {
		if r != "" && !have[r] {
			missing = append(missing, r)
		}
	}
	return missing, nil
}
