package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tree creates files under a temporary root: key -> content, and returns it.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for k, v := range files {
		p := filepath.Join(root, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestGetSet(t *testing.T) {
	root := tree(t, map[string]string{
		"net/netfilter/nf_conntrack_max":                     "262144\n",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000\n",
		"net/ipv4/tcp_rmem":                                  "4096\t131072\t6291456\n",
	})
	s := New(root)
	if got := s.Root(); got != root {
		t.Errorf("Root() = %q, want %q", got, root)
	}
	n, err := s.GetInt("net/netfilter/nf_conntrack_max")
	if err != nil || n != 262144 {
		t.Fatalf("GetInt = %d, %v; want 262144", n, err)
	}
	// sysctl(8)'s dotted form names the same key.
	if n, err := s.GetInt("net.netfilter.nf_conntrack_max"); err != nil || n != 262144 {
		t.Errorf("GetInt(dotted) = %d, %v; want 262144", n, err)
	}
	// A shorter value replaces a longer one entirely.
	if err := s.SetInt("net/netfilter/nf_conntrack_tcp_timeout_established", 86400); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get("net/netfilter/nf_conntrack_tcp_timeout_established"); err != nil || v != "86400" {
		t.Errorf("after SetInt: Get = %q, %v; want 86400", v, err)
	}
	if err := s.Set("net/netfilter/nf_conntrack_max", "1"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.GetInt("net/netfilter/nf_conntrack_max"); n != 1 {
		t.Errorf("after Set: %d, want 1", n)
	}
	if v, err := s.Get("net/ipv4/tcp_rmem"); err != nil || v != "4096\t131072\t6291456" {
		t.Errorf("Get(tcp_rmem) = %q, %v", v, err)
	}
	_, err = s.GetInt("net/ipv4/tcp_rmem")
	var se *Error
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "not an integer") || !strings.Contains(err.Error(), "net/ipv4/tcp_rmem") {
		t.Errorf("GetInt(tcp_rmem) = %v, want a *Error naming the key and saying it is not an integer", err)
	}
	if New("").Root() != DefaultRoot {
		t.Errorf("New(\"\").Root() = %q, want %q", New("").Root(), DefaultRoot)
	}
}

func TestErrors(t *testing.T) {
	root := tree(t, map[string]string{
		"net/netfilter/nf_conntrack_max":         "262144",
		"net/netfilter/nf_conntrack_tcp_loose":   "1",
		"nf_conntrack/parameters/hashsize/extra": "",
	})
	ro := filepath.Join(root, "net/netfilter/nf_conntrack_max")
	if err := os.Chmod(ro, 0o444); err != nil {
		t.Fatal(err)
	}
	s := New(root)

	tests := []struct {
		name     string
		do       func() error
		notExist bool
		readOnly bool
		want     []string // in the message
	}{
		{"MissingRead", func() error { _, err := s.GetInt("net/netfilter/nf_conntrack_udp_timeout"); return err },
			true, false, []string{"read ", "net/netfilter/nf_conntrack_udp_timeout", "no such key"}},
		{"MissingWrite", func() error { return s.SetInt("net/netfilter/nf_conntrack_udp_timeout", 30) },
			true, false, []string{"write ", "nf_conntrack_udp_timeout = 30", "no such key"}},
		{"MissingDirectory", func() error { return s.SetInt("net/nope/key", 1) },
			true, false, []string{"net/nope/key", "no such key"}},
		{"ReadOnlyKey", func() error { return s.SetInt("net/netfilter/nf_conntrack_max", 524288) },
			false, true, []string{"net/netfilter/nf_conntrack_max = 524288", "read-only", "r--r--r--"}},
		{"Directory", func() error { return s.SetInt("nf_conntrack/parameters/hashsize", 1) },
			false, false, []string{"hashsize", "directory"}},
		{"Escape", func() error { return s.SetInt("../etc/passwd", 1) },
			false, false, []string{"not a valid key"}},
		{"Absolute", func() error { _, err := s.Get("/etc/passwd"); return err },
			false, false, []string{"not a valid key"}},
		{"Empty", func() error { _, err := s.Get(""); return err },
			false, false, []string{"not a valid key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			if err == nil {
				t.Fatal("no error")
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Errorf("%v: not a *sysctl.Error", err)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("%v: errors.Is(fs.ErrNotExist) = %v, want %v", err, got, tt.notExist)
			}
			if got := errors.Is(err, ErrReadOnly); got != tt.readOnly {
				t.Errorf("%v: errors.Is(ErrReadOnly) = %v, want %v", err, got, tt.readOnly)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
	// The read-only key is unchanged, and still readable.
	if n, err := s.GetInt("net/netfilter/nf_conntrack_max"); err != nil || n != 262144 {
		t.Errorf("read-only key: %d, %v; want 262144 unchanged", n, err)
	}
	if _, err := os.Stat(filepath.Join(root, "net/netfilter/nf_conntrack_udp_timeout")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write to a missing key created it: %v", err)
	}
}

// TestClassify: the kernel's answers to a write, as errno values.
func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		errno    syscall.Errno
		readOnly bool
		want     string
	}{
		{syscall.EROFS, true, "mounted read-only"},
		{syscall.EACCES, true, "permission denied"},
		{syscall.EPERM, true, "not permitted"},
		{syscall.EOPNOTSUPP, true, "initial network namespace"},
		{syscall.EINVAL, false, "rejected the value"},
		{syscall.ENOENT, false, "no such key"},
		{syscall.EIO, false, "failed"},
	} {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			p := "/proc/sys/net/netfilter/nf_conntrack_max"
			err := newError("write", "net/netfilter/nf_conntrack_max", p, "5", &fs.PathError{Op: "write", Path: p, Err: tt.errno})
			if got := errors.Is(err, ErrReadOnly); got != tt.readOnly {
				t.Errorf("errors.Is(ErrReadOnly) = %v, want %v", got, tt.readOnly)
			}
			if !errors.Is(err, tt.errno) {
				t.Errorf("%v does not wrap %v", err, tt.errno)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || !strings.HasPrefix(msg, "write "+p+" = 5: ") {
				t.Errorf("message %q: want it to start with the key and value and mention %q", msg, tt.want)
			}
			if strings.Count(msg, p) != 1 {
				t.Errorf("message %q names the path more than once", msg)
			}
		})
	}
	// A read that fails with EACCES is not "read-only".
	err := newError("read", "k", "/x/k", "", fmt.Errorf("wrapped: %w", syscall.EACCES))
	if errors.Is(err, ErrReadOnly) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("read EACCES: %v", err)
	}
}

// TestProcSys reads real keys (it never writes one): a value, and the
// error for a key this kernel lacks.
func TestProcSys(t *testing.T) {
	s := New("")
	if _, err := os.Stat(filepath.Join(DefaultRoot, "kernel")); err != nil {
		t.Skipf("no %s here: %v", DefaultRoot, err)
	}
	if v, err := s.Get("kernel/ostype"); err != nil || v != "Linux" {
		t.Errorf("kernel/ostype = %q, %v", v, err)
	}
	_, err := s.GetInt("net/netfilter/no_such_key_knp")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing key: %v, want fs.ErrNotExist", err)
	}
}
