package filesource

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// fastRetry makes a FileSource retry failures after 20 ms, backing off to 200 ms.
func fastRetry(s *FileSource) { s.RetryMin, s.RetryMax = 20*time.Millisecond, 200*time.Millisecond }

// TestFileSourceRetriesReadError: a read that fails for a while (EIO from
// the disk, EMFILE when the process is out of descriptors) is tried again
// with a backoff, without any file event, and the source recovers as soon
// as a retry reads.
func TestFileSourceRetriesReadError(t *testing.T) {
	t.Run("EIO, injected", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "a.yaml")
		write(t, path, svcYAML("a", "10.96.0.1"))
		var failing atomic.Bool
		var attempts atomic.Int32
		r := startSource(t, dir, fastRetry, func(s *FileSource) {
			s.set.readFile = func(name string) ([]byte, fileID, error) {
				if failing.Load() {
					attempts.Add(1)
					return nil, fileID{}, &os.PathError{Op: "read", Path: name, Err: syscall.EIO}
				}
				return readManifest(name)
			}
		})
		r.waitState(t, "default/a:http")
		failing.Store(true)
		replace(t, path, svcYAML("a", "10.96.0.1")+svcYAML("b", "10.96.0.2"))
		r.waitError(t, path, "input/output error")
		// Retried, not only once: the error comes again without an event.
		r.waitError(t, path, "input/output error")
		failing.Store(false) // the disk is back; nothing in the directory changes
		r.waitState(t, "default/a:http", "default/b:http")
		r.wait(t, r.recovered, "recovery")
		t.Logf("%d failed reads before the disk came back", attempts.Load())
	})
	t.Run("EMFILE, real", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "a.yaml")
		write(t, path, svcYAML("a", "10.96.0.1"))
		r := startSource(t, dir, fastRetry)
		r.waitState(t, "default/a:http")
		// The new contents are ready before the descriptors run out; a
		// rename needs none, and is the change the source then fails to read.
		tmp := filepath.Join(dir, ".new")
		write(t, tmp, svcYAML("a", "10.96.0.1")+svcYAML("b", "10.96.0.2"))
		release := exhaustDescriptors(t)
		if err := os.Rename(tmp, path); err != nil {
			release()
			t.Fatal(err)
		}
		err := r.waitError(t, "too many open files")
		release()
		t.Logf("while out of descriptors: %v", err)
		r.waitState(t, "default/a:http", "default/b:http")
		r.wait(t, r.recovered, "recovery")
	})
}

// exhaustDescriptors lowers RLIMIT_NOFILE to just above the descriptors
// open now and fills the rest with /dev/null, so that the next open fails
// with EMFILE; release undoes both.
func exhaustDescriptors(t *testing.T) (release func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(len(entries) + 16)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var hogs []int
	release = func() {
		for _, fd := range hogs {
			syscall.Close(fd)
		}
		hogs = nil
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restoring RLIMIT_NOFILE: %v", err)
		}
	}
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if errors.Is(err, syscall.EMFILE) {
			break
		}
		if err != nil || len(hogs) > 10_000 {
			release()
			t.Fatalf("filling the descriptor table: %v (%d open)", err, len(hogs))
		}
		hogs = append(hogs, fd)
	}
	return release
}

// TestFileSourceNextRetry: the retry delay doubles from RetryMin to
// RetryMax while reloads fail, is gone once one succeeds, and a held
// file's end of hold comes first when it is sooner.
func TestFileSourceNextRetry(t *testing.T) {
	s := &FileSource{RetryMin: time.Second, RetryMax: 30 * time.Second}
	fail := reloadResult{failures: []error{errors.New("EIO")}}
	now := time.Now()
	var got []time.Duration
	for range 7 {
		got = append(got, s.nextRetry(fail, now))
	}
	got = append(got, s.nextRetry(reloadResult{}, now), s.nextRetry(fail, now))
	held := reloadResult{held: 1, recheck: now.Add(300 * time.Millisecond)}
	got = append(got, s.nextRetry(held, now))
	s.backoff = 0
	held.failures = fail.failures
	got = append(got, s.nextRetry(held, now))
	s.RetryMin = 0 // --iptables-min-sync-period 0: retry after 1 s still
	s.backoff = 0
	got = append(got, s.nextRetry(fail, now))
	sourcetest.MustEqual(t, "delays", got, []time.Duration{
		time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second,
		0, time.Second,
		301 * time.Millisecond, 301 * time.Millisecond,
		time.Second,
	})
}

// syncBuffer is a log sink safe for the source's goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// logTo sends a FileSource's log to buf.
func logTo(buf *syncBuffer) func(*FileSource) {
	return func(s *FileSource) { s.log = slog.New(slog.NewTextHandler(buf, nil)) }
}

// waitLog waits until buf holds a line with every one of want.
func waitLog(t *testing.T, buf *syncBuffer, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		for _, line := range strings.Split(buf.String(), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(line, w)
			}
			if ok {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q in:\n%s", want, buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
