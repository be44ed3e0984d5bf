package apiserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Filling an API server with 50,000 Services and their slices takes a
// quarter of an hour on two cores; a benchmark that needs the same objects
// again can save etcd's data once and load it in a later run instead.

// SaveData stops kube-apiserver and etcd gracefully, copies etcd's data
// directory to dst (replacing what was there; written beside it first, so
// a half-written copy is never left under dst), and starts both again on
// the same URLs.
func (s *Server) SaveData(ctx context.Context, dst string) error {
	return s.whileStopped(ctx, func(data string) error {
		tmp := dst + ".tmp"
		_ = os.RemoveAll(tmp)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyTree(data, tmp); err != nil {
			return err
		}
		_ = os.RemoveAll(dst)
		return os.Rename(tmp, dst)
	})
}

// LoadData stops kube-apiserver and etcd, replaces etcd's data with a copy
// of src (saved by SaveData, from a server of the same versions and
// Options), and starts both again on the same URLs: the API server then
// serves what src holds.
func (s *Server) LoadData(ctx context.Context, src string) error {
	if _, err := os.Stat(filepath.Join(src, "member")); err != nil {
		return fmt.Errorf("apiserver: no etcd data in %s: %w", src, err)
	}
	return s.whileStopped(ctx, func(data string) error {
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		return copyTree(src, data)
	})
}

// whileStopped runs fn on etcd's data directory while etcd and
// kube-apiserver are stopped, then starts them again.
func (s *Server) whileStopped(ctx context.Context, fn func(dataDir string) error) error {
	s.mu.Lock()
	etcd, stopped := s.etcd, s.stopped
	s.mu.Unlock()
	if stopped {
		return errors.New("apiserver: server was stopped")
	}
	if err := s.StopAPIServer(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	if err := etcd.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		return fmt.Errorf("stopping etcd: %w", err)
	}
	if err := fn(filepath.Join(s.Dir, "etcd-data")); err != nil {
		return err
	}
	if err := s.startEtcdAgain(ctx); err != nil {
		return err
	}
	return s.startAPI(ctx)
}

// copyTree copies directory src to dst (which must not exist), keeping
// modes.
func copyTree(src, dst string) error {
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copying %s to %s: %w: %s", src, dst, err, out)
	}
	return nil
}
