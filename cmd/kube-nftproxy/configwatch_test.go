package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// configMapDir lays out dir as the kubelet mounts a ConfigMap: the key is a
// symlink through ..data to a timestamped directory; update swaps ..data
// atomically to a new directory, as the kubelet does on an edit.
func configMapDir(t *testing.T, dir, content string) (path string, update func(string)) {
	t.Helper()
	gen := 0
	write := func(content string) {
		gen++
		ts := filepath.Join(dir, "..ts"+string(rune('0'+gen)))
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "config.conf"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write(content)
	path = filepath.Join(dir, "config.conf")
	if err := os.Symlink("..data/config.conf", path); err != nil {
		t.Fatal(err)
	}
	return path, write
}

// The proxy ends with errConfigChanged when its --config file changes, a
// ConfigMap's symlink swap included; an unchanged file (or the same
// content written again) does not end it.
func TestConfigFileChangeEndsTheProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(path string, update func(string))
		changed bool
	}{
		{"configmap edit", func(_ string, update func(string)) { update("b") }, true},
		{"same content again", func(_ string, update func(string)) { update("a") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, update := configMapDir(t, t.TempDir(), "a")
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			done := make(chan struct{})
			go func() {
				defer close(done)
				watchConfigFile(ctx, path, []byte("a"), 10*time.Millisecond, cancel, slog.New(slog.NewTextHandler(io.Discard, nil)))
			}()
			tc.change(path, update)
			select {
			case <-ctx.Done():
				if !tc.changed {
					t.Fatalf("ended on an unchanged file: %v", context.Cause(ctx))
				}
				if !errors.Is(context.Cause(ctx), errConfigChanged) {
					t.Fatalf("cause %v, want errConfigChanged", context.Cause(ctx))
				}
			case <-time.After(time.Second):
				if tc.changed {
					t.Fatal("the change was not noticed within a second (polling every 10ms)")
				}
			}
			cancel(nil)
			<-done
		})
	}
}
