package filesource

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchOptions tune Watch; tests shorten them and learn when the watch is in place.
type watchOptions struct {
	quiet    time.Duration // quiet time after the last event before onChange
	maxDelay time.Duration // longest onChange waits under a steady stream of events
	retry    time.Duration // how often to re-add the watch while the directory is missing
	// writeWait is how long onChange waits for a file being written (a
	// write seen, its close not yet) to be closed.
	writeWait time.Duration
	ready     func() // called each time the inotify watch is (re)established
	held      func() // called when onChange waits for a file being written
}

func defaultWatchOptions() watchOptions {
	return watchOptions{quiet: 100 * time.Millisecond, maxDelay: time.Second, retry: time.Second, writeWait: 5 * time.Second}
}

// The events that can change what LoadState reads. IN_ONLYDIR guards against
// the directory having been replaced by a file.
const watchMask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Watch calls onChange whenever the manifests under path (a file or a
// directory, as for LoadState) are created, written, removed or renamed,
// coalescing bursts of events into one call. It blocks until ctx is done
// (then it returns nil) or inotify fails. A file is watched through its
// directory, so editors that save by renaming and Kubernetes ConfigMap
// volumes (which swap a "..data" symlink) are seen. A directory is also
// watched through its parent, so a path that is a symlink re-pointed to
// another directory is followed. If the directory disappears, onChange is
// called and the watch is re-added once it is back. While a file is being
// written in place (a write seen but not its close), onChange waits for
// the close, a few seconds at most, so a half-written file is not read.
func Watch(ctx context.Context, path string, onChange func()) error {
	return watch(ctx, path, onChange, defaultWatchOptions())
}

type watcher struct {
	f     *os.File
	dir   string // the directory holding the inotify watch
	base  string // file mode: the file's name in dir; "" in directory mode
	wd    int
	alive bool // the watch is in place
	// Directory mode: the watch on dir's parent, for dir's own entry
	// (-1: none), and whether that entry changed so dir must be watched anew.
	parentWd int
	repoint  bool
	// writing holds the files written to and not yet closed, with when
	// the first write was seen.
	writing map[string]time.Time
}

func watch(ctx context.Context, path string, onChange func(), opt watchOptions) error {
	w, err := newWatcher(path)
	if err != nil {
		return err
	}
	defer w.f.Close()
	stop := context.AfterFunc(ctx, func() { w.f.Close() })
	defer stop()

	if err := w.add(); err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	if w.base == "" {
		// Best effort: a parent we may not watch leaves only re-pointing unseen.
		_ = w.addParent()
	}
	if opt.ready != nil {
		opt.ready()
	}
	d := &debounce{opt: opt, writing: w.writing}
	return w.loop(ctx, path, onChange, d)
}

// newWatcher opens an inotify instance for path (a file is watched
// through its directory); nothing is watched yet.
func newWatcher(path string) (*watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	w := &watcher{dir: abs, parentWd: -1, writing: map[string]time.Time{}}
	if !fi.IsDir() {
		w.dir, w.base = filepath.Dir(abs), filepath.Base(abs)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("watching %s: inotify_init1: %w", path, err)
	}
	// A non-blocking fd in an os.File goes through the runtime poller, so
	// reads honour deadlines and Close wakes a blocked Read.
	w.f = os.NewFile(uintptr(fd), "inotify")
	return w, nil
}

// loop reads events until ctx is done or reading fails, calling onChange
// when d says a change is due.
func (w *watcher) loop(ctx context.Context, path string, onChange func(), d *debounce) error {
	buf := make([]byte, 64*1024)
	for {
		deadline := d.deadline()
		if !w.alive {
			if r := time.Now().Add(d.opt.retry); deadline.IsZero() || r.Before(deadline) {
				deadline = r
			}
		}
		if err := w.f.SetReadDeadline(deadline); err != nil {
			return doneOr(ctx, fmt.Errorf("watching %s: %w", path, err))
		}
		n, err := w.f.Read(buf)
		now := time.Now()
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !w.alive && w.add() == nil {
				// It came back; what it holds now may differ from before.
				d.ready()
				d.mark(now)
			}
		case err != nil:
			return doneOr(ctx, fmt.Errorf("watching %s: reading inotify events: %w", path, err))
		case w.relevant(buf[:n], now):
			d.mark(now)
		}
		if w.repoint {
			// The path's entry changed: watch what it names now.
			w.repoint = false
			w.remove()
			w.alive = false
			if w.add() == nil {
				d.ready()
			}
			d.mark(now)
		}
		if d.due(now) {
			onChange()
		}
	}
}

// debounce coalesces events into onChange calls: one is pending from the
// first event on, due after the quiet time since the last event or the
// longest delay since the first, and not before the files being written
// (writing, shared with the watcher) are closed or waited for long enough.
type debounce struct {
	opt         watchOptions
	writing     map[string]time.Time
	pending     bool
	first, last time.Time
	held        bool // opt.held was called for the pending change
}

func (d *debounce) mark(now time.Time) {
	if !d.pending {
		d.first = now
	}
	d.pending, d.last = true, now
}

func (d *debounce) ready() {
	if d.opt.ready != nil {
		d.opt.ready()
	}
}

// quietAt is when the pending change is due, files being written aside.
func (d *debounce) quietAt() time.Time {
	return minTime(d.last.Add(d.opt.quiet), d.first.Add(d.opt.maxDelay))
}

// fireAt is when the pending change is due.
func (d *debounce) fireAt() time.Time {
	at := d.quietAt()
	for _, since := range d.writing {
		if until := since.Add(d.opt.writeWait); until.After(at) {
			at = until
		}
	}
	return at
}

// deadline is when to stop waiting for events: when the pending change is
// due; zero (none) when nothing is pending.
func (d *debounce) deadline() time.Time {
	if !d.pending {
		return time.Time{}
	}
	return d.fireAt()
}

// due reports whether the pending change is due at now, and then clears
// it. While it waits for a file being written, opt.held is called once.
func (d *debounce) due(now time.Time) bool {
	if !d.pending {
		return false
	}
	if at := d.fireAt(); now.Before(at) {
		if !d.held && at.After(d.quietAt()) {
			d.held = true
			if d.opt.held != nil {
				d.opt.held()
			}
		}
		return false
	}
	// Waited long enough for any file still open: read it as it is.
	clear(d.writing)
	d.pending, d.held = false, false
	return true
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// doneOr turns the error a closed inotify file gives after cancellation into nil.
func doneOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// add places the inotify watch on dir.
func (w *watcher) add() error {
	wd, err := w.addWatch(w.dir, watchMask)
	if err != nil {
		return err
	}
	w.wd, w.alive = wd, true
	return nil
}

// addParent watches dir's parent for dir's own entry being replaced.
func (w *watcher) addParent() error {
	wd, err := w.addWatch(filepath.Dir(w.dir), unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
	if err != nil {
		return err
	}
	w.parentWd = wd
	return nil
}

// addWatch adds an inotify watch on path. It runs inside Control so the
// fd cannot be closed (and its number reused) underneath it.
func (w *watcher) addWatch(path string, mask uint32) (int, error) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var wd int
	var addErr error
	if err := rc.Control(func(fd uintptr) {
		wd, addErr = unix.InotifyAddWatch(int(fd), path, mask)
	}); err != nil {
		return 0, err
	}
	if addErr != nil {
		return 0, fmt.Errorf("inotify_add_watch %s: %w", path, addErr)
	}
	return wd, nil
}

// remove drops the watch after the directory was moved away: the watch
// would otherwise follow it to its new name.
func (w *watcher) remove() {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		// Failure means the kernel already dropped it; IN_IGNORED follows either way.
		_, _ = unix.InotifyRmWatch(int(fd), uint32(w.wd))
	})
}

// relevant walks a buffer of inotify events and reports whether any of
// them can change what is loaded. It also tracks the watch's life.
func (w *watcher) relevant(buf []byte, now time.Time) bool {
	const hdr = unix.SizeofInotifyEvent
	changed := false
	for len(buf) >= hdr {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := hdr + int(ev.Len)
		if end > len(buf) {
			break // the kernel never splits events; be safe anyway
		}
		name := strings.TrimRight(string(buf[hdr:end]), "\x00")
		buf = buf[end:]

		switch {
		case ev.Mask&unix.IN_Q_OVERFLOW != 0:
			changed = true // events were lost: assume the worst
			clear(w.writing)
		case int(ev.Wd) == w.parentWd && w.parentWd != w.wd:
			if name == filepath.Base(w.dir) {
				w.repoint = true
			}
		case int(ev.Wd) != w.wd:
			// an event of a watch we already gave up
		case ev.Mask&unix.IN_IGNORED != 0:
			w.alive = false
			changed = true
		case ev.Mask&unix.IN_MOVE_SELF != 0:
			w.remove()
			changed = true
		case ev.Mask&unix.IN_DELETE_SELF != 0:
			changed = true // IN_IGNORED follows
		case w.relevantName(name):
			changed = true
			switch {
			case ev.Mask&unix.IN_MODIFY != 0:
				if _, ok := w.writing[name]; !ok {
					w.writing[name] = now
				}
			case ev.Mask&(unix.IN_CLOSE_WRITE|unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				delete(w.writing, name)
			}
		}
	}
	return changed
}

// relevantName filters directory entries. Names starting with ".." are the
// ConfigMap volume's atomic-update machinery and always count.
func (w *watcher) relevantName(name string) bool {
	if strings.HasPrefix(name, "..") {
		return true
	}
	if w.base != "" {
		return name == w.base
	}
	return isManifestName(name)
}
