package filesource

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// sourceRun is a FileSource running on real files, with what it reported.
type sourceRun struct {
	src       *FileSource
	states    chan *model.State
	errs      chan error
	recovered chan struct{}
	held      chan struct{}
	done      chan error
}

// startSource runs a FileSource on path; opts change it before it runs.
func startSource(t *testing.T, path string, opts ...func(*FileSource)) *sourceRun {
	t.Helper()
	src, err := NewFileSource(path, "node-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &sourceRun{
		src:       src,
		states:    make(chan *model.State, 1000),
		errs:      make(chan error, 1000),
		recovered: make(chan struct{}, 1000),
		held:      make(chan struct{}, 1000),
		done:      make(chan error, 1),
	}
	src.OnState = func(st *model.State) { r.states <- st }
	src.OnError = func(err error) { r.errs <- err }
	src.OnRecovered = func() { r.recovered <- struct{}{} }
	src.watch = watchOptions{
		quiet: 10 * time.Millisecond, maxDelay: 100 * time.Millisecond, retry: 10 * time.Millisecond,
		writeWait: waitLimit, held: func() { r.held <- struct{}{} },
	}
	for _, o := range opts {
		o(src)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { r.done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not stop after cancel")
		}
	})
	return r
}

// names lists a state's service port names.
func names(st *model.State) []string {
	var out []string
	for _, n := range st.SortedNames() {
		out = append(out, n.String())
	}
	return out
}

// waitState waits for a state whose service ports are want.
func (r *sourceRun) waitState(t *testing.T, want ...string) *model.State {
	t.Helper()
	deadline := time.After(waitLimit)
	var last []string
	for {
		select {
		case st := <-r.states:
			if last = names(st); slices.Equal(last, want) {
				return st
			}
		case err := <-r.done:
			t.Fatalf("Run ended: %v", err)
		case <-deadline:
			t.Fatalf("timed out waiting for state %v; last %v", want, last)
		}
	}
}

// waitError waits for a reported failure whose message contains all of want.
func (r *sourceRun) waitError(t *testing.T, want ...string) error {
	t.Helper()
	deadline := time.After(waitLimit)
	var seen []string
	for {
		select {
		case err := <-r.errs:
			msg := err.Error()
			if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(msg, w) }) {
				return err
			}
			seen = append(seen, msg)
		case <-deadline:
			t.Fatalf("timed out waiting for an error with %q; got %q", want, seen)
		}
	}
}

func (r *sourceRun) wait(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// noState fails if a state was handed out.
func (r *sourceRun) noState(t *testing.T) {
	t.Helper()
	select {
	case st := <-r.states:
		t.Fatalf("unexpected state %v", names(st))
	default:
	}
}

// svcYAML is Service default/<name> as one YAML document.
func svcYAML(name, ip string) string {
	return fmt.Sprintf("---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec:\n  clusterIP: %s\n  ports: [{name: http, port: 80}]\n", name, ip)
}

// listYAML is a kind: List of Services, as kubectl get -o yaml prints.
func listYAML(svcs ...string) string {
	s := "apiVersion: v1\nkind: List\nitems:\n"
	for i, name := range svcs {
		s += fmt.Sprintf("- apiVersion: v1\n  kind: Service\n  metadata: {name: %s, namespace: default}\n  spec:\n    clusterIP: 10.96.1.%d\n    ports: [{name: http, port: 80}]\n", name, i+1)
	}
	return s
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes path atomically, as careful tools do.
func replace(t *testing.T, path, body string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	write(t, tmp, body)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestNewFileSourceMissingPath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	_, err := NewFileSource(missing, "node-1", nil)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("NewFileSource(missing) = %v, want an error naming the path", err)
	}
	if st, problems := LoadState(missing, "node-1"); st != nil || len(problems) != 1 {
		t.Errorf("LoadState(missing) = %v, %v", st, problems)
	}
}

// TestFileSourceBrokenFileKeepsContents: a file that stops parsing keeps
// what it gave before; the other files go on changing.
func TestFileSourceBrokenFileKeepsContents(t *testing.T) {
	dir := t.TempDir()
	list, multi := filepath.Join(dir, "list.yaml"), filepath.Join(dir, "multi.yaml")
	write(t, list, listYAML("l1", "l2"))
	write(t, multi, svcYAML("m1", "10.96.2.1")+svcYAML("m2", "10.96.2.2"))
	r := startSource(t, dir)
	r.waitState(t, "default/l1:http", "default/l2:http", "default/m1:http", "default/m2:http")

	// A syntax error in one item of the List, and a tab in one document.
	replace(t, list, strings.Replace(listYAML("l1", "l2", "l3"), "metadata: {name: l2,", "metadata: {name: l2", 1))
	err := r.waitError(t, list+":1: invalid YAML", "line 11")
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != list || fe.Line != 1 {
		t.Errorf("error %v is not a FileError for %s:1", err, list)
	}
	replace(t, multi, svcYAML("m1", "10.96.2.1")+strings.Replace(svcYAML("m2", "10.96.2.2"), "  clusterIP", "\tclusterIP", 1)+svcYAML("m3", "10.96.2.3"))
	r.waitError(t, multi+":9: invalid YAML", "line 13")
	r.noState(t)

	// A good change elsewhere is applied; the broken files keep theirs.
	other := filepath.Join(dir, "other.yaml")
	write(t, other, svcYAML("o1", "10.96.3.1"))
	r.waitState(t, "default/l1:http", "default/l2:http", "default/m1:http", "default/m2:http", "default/o1:http")

	replace(t, list, listYAML("l1", "l2", "l3"))
	replace(t, multi, svcYAML("m1", "10.96.2.1"))
	r.waitState(t, "default/l1:http", "default/l2:http", "default/l3:http", "default/m1:http", "default/o1:http")
	r.wait(t, r.recovered, "recovery")
}

// TestFileSourceFirstViewIncomplete: nothing is handed out until every
// file could be read and parsed once.
func TestFileSourceFirstViewIncomplete(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	write(t, good, svcYAML("good", "10.96.0.1"))
	write(t, bad, "apiVersion: v1\nkind: Service\nmetadata: {name: bad\n")
	r := startSource(t, dir)
	r.waitError(t, bad+":1: invalid YAML")
	r.noState(t)
	write(t, good, svcYAML("good", "10.96.0.1")+svcYAML("good2", "10.96.0.2"))
	r.waitError(t, bad+":1: invalid YAML")
	r.noState(t)

	write(t, bad, svcYAML("bad", "10.96.0.3"))
	r.waitState(t, "default/bad:http", "default/good2:http", "default/good:http")
	r.wait(t, r.recovered, "recovery")
}

// TestFileSourceSpecialFiles: only regular files (or symlinks to them) of
// a bounded size are read; anything else is a failure that keeps what the
// name held before, and neither blocks nor exhausts memory.
func TestFileSourceSpecialFiles(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, path string)
		want string
	}{
		{"fifo", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "a FIFO, not a regular file"},
		{"symlink to /dev/zero", func(t *testing.T, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, "a device, not a regular file"},
		{"dangling symlink", func(t *testing.T, path string) {
			if err := os.Symlink("nowhere", path); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
		{"oversized", func(t *testing.T, path string) {
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(MaxFileSize + 1); err != nil { // sparse: costs no disk
				t.Fatal(err)
			}
		}, "more than the"},
		{"unreadable", func(t *testing.T, path string) {
			write(t, path, svcYAML("s", "10.96.0.9"))
			if err := os.Chmod(path, 0); err != nil {
				t.Fatal(err)
			}
			if f, err := os.Open(path); err == nil {
				f.Close()
				t.Skip("running as root: permissions do not stop reads")
			}
		}, "permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "s.yaml")

			// First view: not complete, nothing handed out.
			tt.make(t, path)
			r := startSource(t, dir)
			r.waitError(t, path, tt.want)
			r.noState(t)

			// Later: the name keeps what it held while it is special.
			replace(t, path, svcYAML("s", "10.96.0.1"))
			r.waitState(t, "default/s:http")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			tt.make(t, path)
			r.waitError(t, path, tt.want)
			write(t, filepath.Join(dir, "t.yaml"), svcYAML("t", "10.96.0.2"))
			r.waitState(t, "default/s:http", "default/t:http")
		})
	}
}

// TestFileSourceSymlinkRepointed: a --state symlink re-pointed to another
// directory, and a ConfigMap volume's ..data swap, are followed.
func TestFileSourceSymlinkRepointed(t *testing.T) {
	t.Run("state symlink", func(t *testing.T) {
		root := t.TempDir()
		v1, v2, state := filepath.Join(root, "v1"), filepath.Join(root, "v2"), filepath.Join(root, "state")
		for _, d := range []string{v1, v2} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		write(t, filepath.Join(v1, "a.yaml"), svcYAML("one", "10.96.0.1"))
		write(t, filepath.Join(v2, "a.yaml"), svcYAML("two", "10.96.0.2"))
		if err := os.Symlink("v1", state); err != nil {
			t.Fatal(err)
		}
		r := startSource(t, state)
		r.waitState(t, "default/one:http")
		// ln -sfn: a new link renamed over the old one.
		if err := os.Symlink("v2", state+".new"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(state+".new", state); err != nil {
			t.Fatal(err)
		}
		r.waitState(t, "default/two:http")
		// Changes in the new target are followed, not the old one's.
		write(t, filepath.Join(v2, "b.yaml"), svcYAML("three", "10.96.0.3"))
		r.waitState(t, "default/three:http", "default/two:http")
	})
	t.Run("ConfigMap ..data", func(t *testing.T) {
		dir := t.TempDir()
		for i, name := range []string{"..v1", "..v2"} {
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, name, "svc.yaml"), svcYAML(fmt.Sprint("gen", i+1), "10.96.0.1"))
		}
		if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..data/svc.yaml", filepath.Join(dir, "svc.yaml")); err != nil {
			t.Fatal(err)
		}
		r := startSource(t, dir)
		r.waitState(t, "default/gen1:http")
		if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		r.waitState(t, "default/gen2:http")
	})
}

// TestFileSourceHalfWritten: a file rewritten in place is read once it is
// closed, not while it is being written.
func TestFileSourceHalfWritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	full := svcYAML("a", "10.96.0.1") + svcYAML("b", "10.96.0.2")
	write(t, path, full)
	r := startSource(t, dir)
	r.waitState(t, "default/a:http", "default/b:http")

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	half := svcYAML("a", "10.96.0.1")
	if _, err := f.WriteString(half); err != nil {
		t.Fatal(err)
	}
	r.wait(t, r.held, "the watcher to hold the reload for the file being written")
	if _, err := f.WriteString(svcYAML("b", "10.96.0.2") + svcYAML("c", "10.96.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// The first state after the close is the whole file; with the half
	// loaded, b would have gone first.
	select {
	case st := <-r.states:
		sourcetest.MustEqual(t, "state after the write", names(st), []string{"default/a:http", "default/b:http", "default/c:http"})
	case <-time.After(waitLimit):
		t.Fatal("no state after the write")
	}
}

// TestFileSourceRereadsOnlyChanged: a reload reads and parses the files
// that changed, and the Builder sees only their objects.
func TestFileSourceRereadsOnlyChanged(t *testing.T) {
	dir := t.TempDir()
	for i := range 10 {
		write(t, filepath.Join(dir, fmt.Sprintf("f%d.yaml", i)), svcYAML(fmt.Sprint("s", i), fmt.Sprintf("10.96.0.%d", i+1)))
	}
	set, err := newFileSet(dir, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	set.racyWindow = 0 // the files were written just now; trust their timestamps
	if res := set.reload(); !res.complete || set.reads != 10 {
		t.Fatalf("first load: complete %v, %d reads", res.complete, set.reads)
	}
	before := set.b.State()
	write(t, filepath.Join(dir, "f3.yaml"), svcYAML("s3", "10.96.0.99")+svcYAML("s3b", "10.96.0.98"))
	if res := set.reload(); !res.complete || set.reads != 11 {
		t.Fatalf("reload: complete %v, %d reads in all, want 11", res.complete, set.reads)
	}
	after := set.b.State()
	for n, sp := range after.Services.All() {
		if n.Name == "s3" || n.Name == "s3b" {
			continue
		}
		if before.Services.Get(n) != sp {
			t.Errorf("%s was rebuilt although its file did not change", n)
		}
	}
	if after.Services.Len() != 11 {
		t.Errorf("got %d services, want 11", after.Services.Len())
	}
}

// TestFileSourceRacy: a file is racy while its timestamps are within the
// racy window of now, on either side; one written before the clock was
// stepped back (in the future now) is not, or every file would be read
// again at every reload until the clock caught up.
func TestFileSourceRacy(t *testing.T) {
	set := &fileSet{racyWindow: time.Second}
	now := time.Now()
	for _, tt := range []struct {
		name  string
		mtime time.Time
		ctime time.Time
		want  bool
	}{
		{"old", now.Add(-time.Hour), now.Add(-time.Hour), false},
		{"just written", now, now, true},
		{"chmod just now", now.Add(-time.Hour), now.Add(-100 * time.Millisecond), true},
		{"a tick ahead", now.Add(500 * time.Millisecond), now.Add(500 * time.Millisecond), true},
		{"clock stepped back by 2h", now.Add(2 * time.Hour), now.Add(2 * time.Hour), false},
	} {
		id := fileID{mtime: tt.mtime.UnixNano(), ctime: tt.ctime.UnixNano()}
		if got := set.racy(id); got != tt.want {
			t.Errorf("%s: racy %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestFileSourceDuplicateNodePort: an older Service added with a NodePort
// another already has takes it, in both families, as LoadState (render, a
// restart) gives it: a restart never moves it. The newer, dual-stack one
// loses that NodePort in IPv4 alone.
func TestFileSourceDuplicateNodePort(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "z.yaml"), `apiVersion: v1
kind: Service
metadata: {name: zeta, namespace: default, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  type: NodePort
  clusterIPs: [10.96.0.1, "fd00::1"]
  ports: [{name: http, port: 80, nodePort: 30080}]
`)
	r := startSource(t, dir)
	r.waitState(t, "default/zeta:http")
	write(t, filepath.Join(dir, "a.yaml"), `apiVersion: v1
kind: Service
metadata: {name: alpha, namespace: default, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  type: NodePort
  clusterIP: 10.96.0.2
  externalIPs: [192.0.2.1]
  ports: [{name: http, port: 80, nodePort: 30080}]
`)
	st := r.waitState(t, "default/alpha:http", "default/zeta:http")
	sourcetest.MustEqual(t, "services", sourcetest.Summarize(st), []string{
		"default/alpha:http TCP/80 cluster=10.96.0.2 ext=192.0.2.1 np=30080",
		"default/zeta:http TCP/80 cluster=10.96.0.1,fd00::1 np=30080",
	})
	if sp := st.Services.Get(model.ServicePortName{Namespace: "default", Name: "zeta", Port: "http"}); sp.NodePortIn(false) != 0 || sp.NodePortIn(true) != 30080 {
		t.Errorf("zeta's NodePort: IPv4 %d, IPv6 %d; want none and 30080", sp.NodePortIn(false), sp.NodePortIn(true))
	}
	loaded, _ := LoadState(dir, "node-1")
	if loaded == nil {
		t.Fatal("LoadState: no state")
	}
	sourcetest.MustEqual(t, "LoadState against the running source", sourcetest.Summarize(loaded), sourcetest.Summarize(st))
}

// TestFileSourcePathGone: the --state directory going away is a failure
// that keeps the state; its return is followed.
func TestFileSourcePathGone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "a.yaml"), svcYAML("a", "10.96.0.1"))
	r := startSource(t, dir)
	r.waitState(t, "default/a:http")
	// Moved away in one step (removing the files one by one would be a
	// change of its own).
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	r.waitError(t, dir, "no such file")
	r.noState(t)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "b.yaml"), svcYAML("b", "10.96.0.2"))
	r.waitState(t, "default/b:http")
	r.wait(t, r.recovered, "recovery")
}
