package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// Every sandbox namespace is named namePrefix + 6 hex digits + "-" + name.
// The owner holds an exclusive flock on lockDir/<namePrefix><id>.lock for the
// sandbox's lifetime, so a sandbox whose lock can be taken is stale: its
// owner died without Close.
const (
	namePrefix = "knp-"
	lockDir    = "/run/kube-nftproxy-e2e"
	netnsDir   = "/run/netns" // where `ip netns` keeps named namespaces
)

var staleRE = regexp.MustCompile(`^` + namePrefix + `([0-9a-f]{6})-`)

func lockPath(id string) string { return filepath.Join(lockDir, namePrefix+id+".lock") }

// acquireLock creates and locks the lock file of a new sandbox. It is taken
// before any namespace exists, so a namespace without a lock file is stale.
// The file is locked before it appears under its name (a hard link from a
// temporary file), so a sweep never sees it unlocked while its owner lives.
func acquireLock(id string) (*lock, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	f, err := os.CreateTemp(lockDir, ".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	fmt.Fprintf(f, "%d\n", os.Getpid())
	if err := os.Link(tmp, lockPath(id)); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file: %w", err)
	}
	return &lock{f: f, path: lockPath(id)}, nil
}

// lock is a held sandbox lock file.
type lock struct {
	f    *os.File
	path string
}

// release removes the lock file, then unlocks it.
func (l *lock) release() {
	os.Remove(l.path)
	l.f.Close()
}

// unlock unlocks the lock file and leaves it in place.
func (l *lock) unlock() { l.f.Close() }

// listNamespaces returns the names of all named network namespaces.
func listNamespaces() ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// nsExists reports whether the named namespace exists (or may: any error
// but "not found" counts as existing).
func nsExists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return !errors.Is(err, fs.ErrNotExist)
}

// sweepStale deletes the namespaces and lock files of sandboxes whose owner
// is gone. Sandboxes of live processes (this one included) are left alone.
// Failures are only logged: they must not stop a new sandbox.
func sweepStale(ctx context.Context, ipCmd string, logf func(string, ...any)) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	names, err := listNamespaces()
	if err != nil {
		logf("sandbox: sweep: %v", err)
		return
	}
	byID := map[string][]string{}
	for _, n := range names {
		if m := staleRE.FindStringSubmatch(n); m != nil {
			byID[m[1]] = append(byID[m[1]], n)
		}
	}
	// Lock files without namespaces are stale too.
	if locks, err := filepath.Glob(filepath.Join(lockDir, namePrefix+"*.lock")); err == nil {
		for _, l := range locks {
			id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(l), namePrefix), ".lock")
			if _, ok := byID[id]; !ok && len(id) == 6 {
				byID[id] = nil
			}
		}
	}
	for id, nss := range byID {
		var l *lock
		f, err := os.OpenFile(lockPath(id), os.O_RDWR, 0)
		switch {
		case err == nil:
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				f.Close() // its owner lives
				continue
			}
			l = &lock{f: f, path: lockPath(id)}
		case !errors.Is(err, fs.ErrNotExist):
			logf("sandbox: sweep: %v", err)
			continue
		}
		failed := false
		for _, ns := range nss {
			out, err := exec.CommandContext(ctx, ipCmd, "netns", "delete", ns).CombinedOutput()
			if err != nil {
				// Close of a live sandbox may have raced us to it.
				if nsExists(ns) {
					logf("sandbox: sweep: delete %s: %v: %s", ns, err, strings.TrimSpace(string(out)))
					failed = true
				}
				continue
			}
			logf("sandbox: swept stale namespace %s", ns)
		}
		if l != nil {
			if failed {
				l.unlock()
			} else {
				l.release()
			}
		}
	}
}
