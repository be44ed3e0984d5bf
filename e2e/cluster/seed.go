package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The image seed. Importing the images into each node's containerd (every
// layer unpacked, on every node, at every start) took most of a cluster's
// start: 85 s for 14 archives on three nodes at once. The archives that
// change only when images.sh fetches new versions are imported once into a
// containerd root kept in the cache; each node's root starts as hard links
// to it, and only the archives built from this tree (our image) are
// imported at start. Hard links are safe here: containerd never writes a
// committed snapshot or a content blob again (it removes them), overlayfs
// copies a lower file up before changing it, and the bolt databases, which
// containerd does write, are copied, not linked.

// seedFormat names the seed's layout; a change of this code that makes
// older seeds unfit changes it.
const seedFormat = "1"

// splitSeedImages parts imgs into the archives a seed holds and those
// imported at each start: the ones that carry one of our own images.
func splitSeedImages(imgs []Image) (seeded, rest []Image) {
	ours := map[string]bool{}
	for _, im := range imgs {
		if imageName(im.Ref) == "kube-nftproxy" {
			ours[im.File] = true
		}
	}
	for _, im := range imgs {
		if ours[im.File] {
			rest = append(rest, im)
		} else {
			seeded = append(seeded, im)
		}
	}
	return seeded, rest
}

// seedKey identifies a seed by what went into it: containerd and each
// archive's name, size and modification time.
func (l Layout) seedKey(seeded []Image) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "format %s\n", seedFormat)
	files := []string{l.containerdBin()}
	for _, im := range seeded {
		files = append(files, im.File)
	}
	sort.Strings(files)
	for i, f := range files {
		if i > 0 && f == files[i-1] {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// seedsDir holds the seeds, one directory per key.
func (l Layout) seedsDir() string { return filepath.Join(l.Cache, "cluster", "containerd-seed") }

// imageSeed returns the seed's containerd root for imgs, making it first
// if the cache has none for them, and the archives it leaves to each node.
// Making one replaces every older seed.
func (l Layout) imageSeed(ctx context.Context, imgs []Image, logf func(string, ...any)) (root string, rest []Image, err error) {
	seeded, rest := splitSeedImages(imgs)
	key, err := l.seedKey(seeded)
	if err != nil {
		return "", nil, err
	}
	dir := filepath.Join(l.seedsDir(), key)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return filepath.Join(dir, "root"), rest, nil
	}
	start := time.Now()
	tmp := dir + ".tmp-" + strconv.Itoa(os.Getpid())
	if err := os.RemoveAll(tmp); err != nil {
		return "", nil, err
	}
	n, err := l.makeSeed(ctx, tmp, seeded)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("making the image seed: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return "", nil, err
	}
	if err := pruneSeeds(l.seedsDir(), tmp); err != nil {
		return "", nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", nil, err
	}
	logf("image seed: %d archives imported once in %v (%s)", n, time.Since(start).Round(100*time.Millisecond), dir)
	return filepath.Join(dir, "root"), rest, nil
}

// linkable reports why the seed's files cannot be hard-linked into dir
// (another filesystem), or nil.
func linkable(seedRoot, dir string) error {
	probe := filepath.Join(dir, ".seed-link-probe")
	_ = os.Remove(probe)
	if err := os.Link(filepath.Join(seedRoot, "io.containerd.metadata.v1.bolt", "meta.db"), probe); err != nil {
		return fmt.Errorf("the image seed cannot be linked into %s: %w", dir, err)
	}
	return os.Remove(probe)
}

// pruneSeeds removes everything in dir but keep (the cache keeps one seed).
func pruneSeeds(dir, keep string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); p != keep {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeSeed runs a containerd of its own on dir/root (no CRI, no NRI, no
// network), imports the archives into the CRI's namespace and stops it.
func (l Layout) makeSeed(ctx context.Context, dir string, seeded []Image) (int, error) {
	state := containerdRun + "seed-" + strconv.Itoa(os.Getpid())
	defer os.RemoveAll(state)
	if err := os.MkdirAll(filepath.Join(dir, "root"), 0o700); err != nil {
		return 0, err
	}
	cfg := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(cfg, []byte(l.seedConfig(ctx, dir, state)), 0o600); err != nil {
		return 0, err
	}
	logFile, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	cmd := exec.Command(l.containerdBin(), "--config", cfg)
	cmd.Stdout, cmd.Stderr, cmd.Env = logFile, logFile, l.daemonEnv()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer stopSeedContainerd(cmd)
	sock := filepath.Join(state, "containerd.sock")
	err = poll(ctx, time.Minute, func() (bool, error) {
		return run(ctx, l.ctrBin(), "--address", sock, "version") == nil, nil
	})
	if err != nil {
		return 0, fmt.Errorf("the seed's containerd (log %s): %w", logFile.Name(), err)
	}
	n, err := l.importArchives(ctx, sock, seeded)
	if err != nil {
		return 0, err
	}
	return n, stopSeedContainerd(cmd)
}

// stopSeedContainerd ends the seed's containerd: SIGTERM, then SIGKILL
// after 30 s. Its databases are whole once it has exited.
func stopSeedContainerd(cmd *exec.Cmd) error {
	if cmd.ProcessState != nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	timer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	if err := cmd.Wait(); err != nil && !timer.Stop() {
		return fmt.Errorf("the seed's containerd did not stop in 30 s: %w", err)
	}
	return nil
}

// seedConfig is the seed containerd's configuration: its root under dir,
// its state and socket in state, the CRI and NRI plugins off (the images
// go in with ctr, into the CRI's namespace and the default snapshotter,
// overlayfs, which the nodes' CRI uses).
func (l Layout) seedConfig(ctx context.Context, dir, state string) string {
	version, off := 2, `"io.containerd.grpc.v1.cri", "io.containerd.nri.v1.nri"`
	if containerdMajor(ctx, l.containerdBin()) >= 2 {
		version = 3
		off += `, "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.podsandbox.controller.v1.podsandbox"`
	}
	return fmt.Sprintf(`version = %d
root = %q
state = %q
disabled_plugins = [%s]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, version, filepath.Join(dir, "root"), state, off, filepath.Join(state, "containerd.sock"), filepath.Join(dir, "opt"))
}

// seedInstanceFile is the seed containerd's own identity, which each node's
// containerd makes anew.
const seedInstanceFile = "io.containerd.grpc.v1.introspection/uuid"

// linkSeed makes root, a node's containerd root, a copy of the seed's in
// which every file is a hard link (cp -al keeps directories' owners, modes
// and overlay xattrs) except the databases, which are copied, and the
// seed's instance identity, which is left out.
func linkSeed(ctx context.Context, seed, root string) error {
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	if err := run(ctx, "cp", "-al", seed, root); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(root, seedInstanceFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dbs, err := seedDatabases(root)
	if err != nil {
		return err
	}
	for _, db := range dbs {
		if err := os.Remove(db); err != nil {
			return err
		}
		rel := strings.TrimPrefix(db, root)
		if err := run(ctx, "cp", "-a", filepath.Join(seed, rel), db); err != nil {
			return err
		}
	}
	return nil
}

// seedDatabases lists the bolt databases in a containerd root: the files
// named *.db in its plugins' directories (never inside a snapshot).
func seedDatabases(root string) ([]string, error) {
	var dbs []string
	plugins, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, p := range plugins {
		if !p.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, p.Name()))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if f.Type().IsRegular() && strings.HasSuffix(f.Name(), ".db") {
				dbs = append(dbs, filepath.Join(root, p.Name(), f.Name()))
			}
		}
	}
	return dbs, nil
}
