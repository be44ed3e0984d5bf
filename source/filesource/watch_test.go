package filesource

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitLimit bounds every wait; tests never sleep to synchronise.
const waitLimit = 10 * time.Second

type watchRun struct {
	changes chan struct{}
	ready   chan struct{}
	done    chan error
	cancel  context.CancelFunc
}

func startWatch(t *testing.T, path string) *watchRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &watchRun{
		changes: make(chan struct{}, 100),
		ready:   make(chan struct{}, 100),
		done:    make(chan error, 1),
		cancel:  cancel,
	}
	opt := watchOptions{
		quiet: 10 * time.Millisecond, maxDelay: 100 * time.Millisecond, retry: 10 * time.Millisecond,
		ready: func() { r.ready <- struct{}{} },
	}
	go func() { r.done <- watch(ctx, path, func() { r.changes <- struct{}{} }, opt) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(waitLimit):
			t.Error("watch did not stop after cancel")
		}
	})
	r.wait(t, r.ready, "the watch to be placed")
	return r
}

func (r *watchRun) wait(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case err := <-r.done:
		t.Fatalf("watch ended while waiting for %s: %v", what, err)
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// step drains what earlier steps caused, does one thing and waits for the
// notification it must cause.
func (r *watchRun) step(t *testing.T, what string, do func() error) {
	t.Helper()
	for len(r.changes) > 0 {
		<-r.changes
	}
	if err := do(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	r.wait(t, r.changes, "a change after: "+what)
}

func TestWatchDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	r := startWatch(t, dir)

	r.step(t, "create", func() error { return os.WriteFile(a, []byte("a: 1\n"), 0o644) })
	r.step(t, "modify", func() error { return os.WriteFile(a, []byte("a: 2\n"), 0o644) })
	r.step(t, "rename", func() error { return os.Rename(a, b) })
	r.step(t, "replace by rename, as editors save", func() error {
		tmp := filepath.Join(dir, ".b.yaml.swp")
		if err := os.WriteFile(tmp, []byte("b: 3\n"), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, b)
	})
	r.step(t, "remove", func() error { return os.Remove(b) })
	r.step(t, "ConfigMap-style ..data swap", func() error {
		return os.Symlink("..2024_01_01", filepath.Join(dir, "..data"))
	})
	r.step(t, "directory removed", func() error { return os.RemoveAll(dir) })
	r.step(t, "directory back", func() error { return os.Mkdir(dir, 0o755) })
	r.wait(t, r.ready, "the watch to be placed again")
	r.step(t, "create in the new directory", func() error { return os.WriteFile(a, nil, 0o644) })
	r.step(t, "directory moved away", func() error { return os.Rename(dir, dir+".old") })
	r.step(t, "another directory moved in", func() error { return os.Rename(dir+".old", dir) })
	r.step(t, "create after the move", func() error { return os.WriteFile(b, nil, 0o644) })

	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Watch returned %v after cancel, want nil", err)
		}
		r.done <- err // for the cleanup
	case <-time.After(waitLimit):
		t.Fatal("watch did not stop after cancel")
	}
}

func TestWatchFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "state.yaml")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := startWatch(t, f)
	r.step(t, "write", func() error { return os.WriteFile(f, []byte("a: 1\n"), 0o644) })
	r.step(t, "replace by rename", func() error {
		tmp := filepath.Join(dir, "state.yaml.new")
		if err := os.WriteFile(tmp, []byte("a: 2\n"), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, f)
	})
	r.step(t, "remove", func() error { return os.Remove(f) })
}

func TestWatchMissingPath(t *testing.T) {
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "nope"), func() {})
	if err == nil {
		t.Fatal("want an error for a missing path")
	}
}

func TestWatchRelevantName(t *testing.T) {
	dirMode := &watcher{}
	fileMode := &watcher{base: "state.yaml"}
	tests := []struct {
		w    *watcher
		name string
		want bool
	}{
		{dirMode, "web.yaml", true},
		{dirMode, "web.YML", true},
		{dirMode, "web.json", true},
		{dirMode, "..data", true},
		{dirMode, "..2024_01_01_00_00_00.123", true},
		{dirMode, ".web.yaml.swp", false},
		{dirMode, "4913", false},
		{dirMode, "notes.txt", false},
		{fileMode, "state.yaml", true},
		{fileMode, "..data", true},
		{fileMode, "other.yaml", false},
		{fileMode, "state.yaml.new", false},
	}
	for _, tt := range tests {
		if got := tt.w.relevantName(tt.name); got != tt.want {
			t.Errorf("relevantName(%q) with base %q = %v, want %v", tt.name, tt.w.base, got, tt.want)
		}
	}
}
