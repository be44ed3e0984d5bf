// Package filesource is standalone mode's source: Services, EndpointSlices
// and Nodes kept in a manifest file or a directory of them, decoded with
// source/manifest into a kube.Builder, reloaded on every change an
// inotify watch signals. A file that cannot be read or parsed, that looks
// cut short while being written, or that gave objects and is now empty,
// keeps the objects it gave last time, under a new name too if it was
// renamed within the directory; LoadState is the same load done once, for
// render, diff and trace.
package filesource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
)

// MaxFileSize is the largest manifest file the file source reads. kubectl's
// YAML for 10,000 Services with their EndpointSlices is about 30 MiB; a
// larger file is refused (and keeps what it held before) rather than read,
// so a path pointing at something huge cannot exhaust memory.
const MaxFileSize = 64 << 20

// freeMemoryAfterRead is how many bytes of files one reload must read for
// the memory it freed to be handed back to the kernel at once. Parsing
// costs many times a file's size in garbage, which Go would otherwise keep
// for reuse (the RSS staying far above the live heap), and state files
// are rarely that large, so a forced collection after such a read is
// cheap next to the read itself.
const freeMemoryAfterRead = 8 << 20

// FileSource follows Services, EndpointSlices and Nodes kept in a file or a
// directory of manifests (standalone mode) and hands out a State each time
// they change, never one that is not complete: a file that cannot be read
// or parsed keeps the objects it gave last time, and until every file has
// been read once, no State is handed out at all. Bad objects inside a file
// that parses are skipped alone, with a warning.
//
// Set the callbacks before Run; they are called from Run's goroutine, one
// at a time.
type FileSource struct {
	// OnState receives each new complete State.
	OnState func(*model.State)
	// OnError receives every failure of the source: the path cannot be
	// listed, or a file cannot be read or parsed (a *FileError naming the
	// file and line). Each reload reports every failure it meets again.
	// Without OnError they are logged.
	OnError func(error)
	// OnRecovered is called when a reload meets no failure after one that did.
	OnRecovered func()
	// RetryMin and RetryMax bound the backoff of the reloads that retry a
	// failure without waiting for a file event (a read error such as EIO
	// or EMFILE may pass while nothing in the directory changes): the
	// first comes RetryMin after the failure, each next one twice as late,
	// up to RetryMax. kube-nftproxy sets them to --iptables-min-sync-period
	// and --iptables-sync-period, as for a failed sync.
	RetryMin, RetryMax time.Duration

	log   *slog.Logger
	set   *fileSet
	watch watchOptions

	published *model.State // the last State handed to OnState
	failing   bool
	conflicts map[string]bool // the conflicts already logged
	backoff   time.Duration   // the last retry delay; 0 while nothing fails
}

// Defaults of RetryMin and RetryMax: kube-proxy's sync periods.
const (
	defaultRetryMin = time.Second
	defaultRetryMax = 30 * time.Second
)

// NewFileSource returns a FileSource for path (a file, or a directory whose
// *.yaml, *.yml and *.json files are read) building the state of node
// nodeName, its Builder made with opts. It fails if path cannot be read
// now: a proxy started on a mistyped path should stop, not run with
// nothing programmed.
func NewFileSource(path, nodeName string, log *slog.Logger, opts ...kube.Option) (*FileSource, error) {
	if _, err := manifestFiles(path); err != nil {
		return nil, err
	}
	set, err := newFileSet(path, nodeName, opts...)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &FileSource{log: log, set: set, watch: defaultWatchOptions(),
		RetryMin: defaultRetryMin, RetryMax: defaultRetryMax}
	return s, nil
}

// Run loads the manifests, then reloads them on every change until ctx is
// done (it then returns nil) or the inotify watch fails. Loading happens
// here, not in the watcher, which only signals; signals arriving during a
// load are coalesced into one more load.
func (s *FileSource) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kick := make(chan struct{}, 1)
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	opt := s.watch
	ready := opt.ready
	// The first load follows the watch's placement, so no change between
	// the two goes unseen; a re-placed watch (the path came back) also
	// means another look.
	opt.ready = func() {
		signal()
		if ready != nil {
			ready()
		}
	}
	// A file held as still being written is judged once it was left
	// alone for as long as the watcher waits for a file being written.
	s.set.holdFor = opt.writeWait
	done := make(chan error, 1)
	go func() { done <- watch(ctx, s.set.path, signal, opt) }()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return nil
		case err := <-done:
			if err != nil {
				return fmt.Errorf("following %s: %w", s.set.path, err)
			}
			return nil
		case <-kick:
		case <-retry.C:
		}
		// Any reload retries every failed file, so the timer is set anew.
		if wait := s.reload(); wait > 0 {
			retry.Reset(wait)
		} else {
			retry.Stop()
		}
	}
}

// nextRetry is how long to wait before reading again without an event (0:
// not before the next one): after a failure, the backoff from RetryMin
// doubling up to RetryMax; for a file held as still being written, when
// its hold ends, if that is sooner.
func (s *FileSource) nextRetry(res reloadResult, now time.Time) time.Duration {
	var wait time.Duration
	if len(res.failures) == 0 {
		s.backoff = 0
	} else {
		lo := s.RetryMin
		if lo <= 0 {
			lo = defaultRetryMin
		}
		s.backoff = min(max(2*s.backoff, lo), max(s.RetryMax, lo))
		wait = s.backoff
	}
	if !res.recheck.IsZero() {
		// A little past the hold's end, so the hold has surely ended.
		if until := res.recheck.Sub(now) + time.Millisecond; wait == 0 || until < wait {
			wait = max(until, time.Millisecond)
		}
	}
	return wait
}

// reload reads what changed and hands out the State if it is complete and
// new. It returns when to read again unprompted (see nextRetry).
func (s *FileSource) reload() time.Duration {
	res := s.set.reload()
	for _, p := range res.problems {
		s.log.Warn("skipping bad input", "err", p)
	}
	s.logRemoved(res.removed)
	for _, err := range res.failures {
		if s.OnError != nil {
			s.OnError(err)
		} else {
			s.log.Error("state source failing", "err", err)
		}
	}
	if len(res.failures) > 0 {
		s.failing = true
	} else if s.failing {
		s.failing = false
		if s.OnRecovered != nil {
			s.OnRecovered()
		}
	}
	wait := s.nextRetry(res, time.Now())
	if s.published == nil && !res.complete {
		s.log.Warn("not programming anything until every manifest can be read", "path", s.set.path,
			"failures", len(res.failures), "held", res.held)
		return wait
	}
	s.logConflicts()
	st := s.set.b.State()
	if st == s.published {
		return wait // the Builder hands out the same snapshot when nothing changed
	}
	s.published = st
	if s.OnState != nil {
		s.OnState(st)
	}
	if s.set.readBytes >= freeMemoryAfterRead {
		debug.FreeOSMemory()
	}
	return wait
}

// maxRemovedNamed bounds the Services named in the log of one removal.
const maxRemovedNamed = 10

// logRemoved logs the Services a change of the state files took away, and
// the files that defined them: a file cut short at a document boundary is
// valid, and this is all that shows it.
func (s *FileSource) logRemoved(removed []removedService) {
	if len(removed) == 0 {
		return
	}
	var names, files []string
	for _, r := range removed {
		if len(names) < maxRemovedNamed {
			names = append(names, r.namespace+"/"+r.name)
		}
		file := r.source // "file:line", maybe with " items[N]"
		if i := strings.LastIndexByte(file, ':'); i > 0 {
			file = file[:i]
		}
		if !slices.Contains(files, file) {
			files = append(files, file)
		}
	}
	list := strings.Join(names, ", ")
	if more := len(removed) - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	s.log.Info("Services removed: no state file defines them any more", "count", len(removed), "services", list, "files", strings.Join(files, ", "))
}

// logConflicts logs the values Services lose to each other, each once
// while it lasts.
func (s *FileSource) logConflicts() {
	now := map[string]bool{}
	for _, err := range s.set.b.ConflictErrors() {
		// Name where the losing Service is defined, as for other bad input.
		var ce *kube.ConflictError
		if errors.As(err, &ce) {
			if o, ok := s.set.current[objectRef{"service", ce.Loser.Namespace, ce.Loser.Name}]; ok {
				err = fmt.Errorf("%s: %w", o.Source, err)
			}
		}
		msg := err.Error()
		now[msg] = true
		if !s.conflicts[msg] {
			s.log.Warn("skipping bad input", "err", err)
		}
	}
	s.conflicts = now
}

// FileError is a manifest file, or the path holding them, that cannot be
// read or parsed. The file keeps the objects it gave last time, if any.
type FileError struct {
	Path string
	Line int // where the bad document starts; 0 when the file could not be read
	Err  error
}

func (e *FileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %v", e.Path, e.Line, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Path, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// fileSet holds the parsed contents of every manifest file and feeds the
// objects that change to a Builder, so a reload costs what changed.
type fileSet struct {
	path string
	b    *kube.Builder
	// dec trims each object it decodes to what the Builder reads
	// (kube.Slimmer): the objects are kept while their file is unchanged.
	dec   *manifest.Decoder
	files map[string]*fileEntry
	// current is the definition of every object in the Builder: the one
	// of the last file (in name order) defining it.
	current map[objectRef]manifest.Object
	// racyWindow is how recent a change must be for a file to be read
	// again even if its identity looks unchanged: file timestamps advance
	// in ticks of up to a few milliseconds.
	racyWindow time.Duration
	// holdFor is how long a file that looks cut short (see
	// manifest.Tail.CutShort) is taken as still being written, keeping its
	// previous contents, before it is a failure; 0 makes it one at once.
	holdFor   time.Duration
	readFile  func(name string) ([]byte, fileID, error) // readManifest; tests inject errors
	reads     int                                       // files read so far
	readBytes int64                                     // bytes read by the last reload
}

// fileEntry is one manifest file as last read.
type fileEntry struct {
	id fileID
	// objs are the objects of the last good read; good is false until
	// there was one.
	objs []manifest.Object
	good bool
	// failed holds why the latest read failed; nil if it did not.
	failed *FileError
	// failedID is the file whose contents failed (a syntax error, a
	// special or oversized file, one cut short): while it stays the same,
	// retries do not read it again. Zero when reading itself failed.
	failedID fileID
	// racy is set when the file changed so recently that a change in the
	// same timestamp tick could leave id unchanged: read it again next time.
	racy bool
	// held says why the latest read looked cut short ("" if it did not);
	// heldID is that version of the file, seen first at heldSince.
	held      string
	heldID    fileID
	heldSince time.Time
	// newline: the last good read ended with a newline.
	newline bool
}

// fileID tells whether a file may have changed since it was read.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns; ctime moves with chmod and rename too
}

func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}, true
}

func newFileSet(path, nodeName string, opts ...kube.Option) (*fileSet, error) {
	dec, err := manifest.NewDecoder()
	if err != nil {
		return nil, err
	}
	dec.Transform = kube.NewSlimmer().SlimObject
	return &fileSet{
		path: path, b: kube.NewBuilder(nodeName, opts...), dec: dec,
		files: map[string]*fileEntry{}, current: map[objectRef]manifest.Object{},
		racyWindow: time.Second, readFile: readManifest,
	}, nil
}

// reloadResult is what one reload met.
type reloadResult struct {
	// failures are the files (or the path) that could not be read or
	// parsed, as *FileError.
	failures []error
	// problems are bad objects and values, skipped alone, and warnings.
	problems []error
	// complete is set when every file is held as read last time it changed.
	complete bool
	// held counts the files that look cut short and keep their previous
	// contents for now; recheck is when the first of their holds ends.
	held    int
	recheck time.Time
	// removed are the Services this reload took away, in name order.
	removed []removedService
}

// removedService is a Service gone from the state files, with where it
// was defined.
type removedService struct {
	namespace, name, source string
}

// reload re-reads the files that changed and updates the Builder. If the
// path cannot be listed, nothing changes.
func (s *fileSet) reload() reloadResult {
	var res reloadResult
	s.readBytes = 0
	names, err := manifestFiles(s.path)
	if err != nil {
		res.failures = append(res.failures, &FileError{Path: s.path, Err: err})
		return res
	}
	changed := false
	listed := make(map[string]bool, len(names))
	for _, name := range names {
		listed[name] = true
	}
	gone := s.goneByInode(listed)
	for _, name := range names {
		e := s.files[name]
		if e == nil {
			if e = s.takeRenamed(name, gone); e != nil {
				changed = true // it may now come earlier or later in name order
			} else {
				e = &fileEntry{}
			}
			s.files[name] = e
		} else if s.unchanged(name, e) {
			continue
		}
		fresh, problems := s.read(name, e)
		changed = changed || fresh
		res.problems = append(res.problems, problems...)
	}
	for name := range s.files {
		if !listed[name] {
			delete(s.files, name)
			changed = true
		}
	}
	res.complete = true
	for _, name := range names {
		e := s.files[name]
		switch {
		case e.failed != nil:
			res.failures = append(res.failures, e.failed)
			res.complete = false
		case e.held != "":
			res.held++
			res.complete = false
			if end := e.heldSince.Add(s.holdFor); res.recheck.IsZero() || end.Before(res.recheck) {
				res.recheck = end
			}
		}
	}
	if changed {
		var problems []error
		problems, res.removed = s.apply(names)
		res.problems = append(res.problems, problems...)
	}
	return res
}

// inode names a file whatever its name.
type inode struct{ dev, ino uint64 }

// goneByInode indexes the files no longer listed by the inodes they had
// when last read; nil if none went.
func (s *fileSet) goneByInode(listed map[string]bool) map[inode]string {
	var gone map[inode]string
	for name, e := range s.files {
		if listed[name] {
			continue
		}
		if gone == nil {
			gone = map[inode]string{}
		}
		for _, id := range []fileID{e.id, e.failedID, e.heldID} {
			if id.ino != 0 {
				gone[inode{id.dev, id.ino}] = name
			}
		}
	}
	return gone
}

// takeRenamed returns the entry of a file that went from the listing and
// whose inode name now has: the file was renamed. It keeps its last good
// contents under its new name, so a file made invalid (or emptied) and then
// renamed does not lose its objects; nil if name is a new file.
// (A file deleted as another is created may hand its inode number on; the
// new file then starts from the deleted one's contents, which last only
// while it cannot be read: its first good read replaces them.)
func (s *fileSet) takeRenamed(name string, gone map[inode]string) *fileEntry {
	if len(gone) == 0 {
		return nil
	}
	fi, err := os.Stat(name)
	if err != nil {
		return nil
	}
	id, ok := idOf(fi)
	if !ok {
		return nil
	}
	old, found := gone[inode{id.dev, id.ino}]
	if !found {
		return nil
	}
	e := s.files[old]
	delete(s.files, old)
	delete(gone, inode{id.dev, id.ino})
	return e
}

// unchanged reports whether a file need not be read again: it is as it
// was when it was last read well, or when its contents last failed.
func (s *fileSet) unchanged(name string, e *fileEntry) bool {
	var want fileID
	switch {
	case e.held != "":
		return false
	case e.failed == nil && e.good:
		want = e.id
	case e.failed != nil && e.failedID != fileID{}:
		want = e.failedID
	default:
		return false
	}
	if s.racy(want) {
		return false
	}
	fi, err := os.Stat(name)
	if err != nil {
		return false
	}
	id, ok := idOf(fi)
	return ok && id == want
}

// racy reports whether a file changed so recently that a change in the
// same timestamp tick could leave its identity unchanged. The timestamps
// are wall clock time: after the clock was stepped back, a file written
// before the step is in the future, and no new write can share its tick
// (racy then would re-read every file at every reload until the clock
// caught up).
func (s *fileSet) racy(id fileID) bool {
	near := func(ns int64) bool { return time.Since(time.Unix(0, ns)).Abs() < s.racyWindow }
	return near(id.mtime) || near(id.ctime)
}

// read reads and parses one file into e. fresh reports whether e's objects
// changed; a file that cannot be read or parsed keeps its old objects.
func (s *fileSet) read(name string, e *fileEntry) (fresh bool, problems []error) {
	s.reads++
	data, id, err := s.readFile(name)
	s.readBytes += int64(len(data))
	if err != nil {
		// A special or oversized file comes with its identity: it is not
		// read again until it changes. A failed read is retried.
		e.failed, e.failedID, e.held = &FileError{Path: name, Err: err}, id, ""
		return false, nil
	}
	objs, errs, tail := s.dec.DecodeWithTail(data, name)
	for _, err := range errs {
		var se *manifest.SyntaxError
		if errors.As(err, &se) {
			e.failed = &FileError{Path: name, Line: se.Line, Err: fmt.Errorf("invalid YAML in the document starting here: %w", se)}
			e.failedID, e.held = id, ""
			return false, nil
		}
	}
	if len(data) == 0 && e.good && len(e.objs) > 0 {
		// Truncated, and not yet written again (or its writer failed, as
		// `kubectl get ... > file` does when the API server is away).
		reason := fmt.Sprintf("it is empty, and gave %d objects before (to remove them, delete the file or write a document without objects, such as a kind: List with no items)", len(e.objs))
		_, problem := s.hold(name, e, id, reason, true)
		return false, problem
	}
	if reason, strong := tail.CutShort(data); reason != "" {
		if held, problem := s.hold(name, e, id, reason, strong); held {
			return false, problem
		}
		errs = append(errs, &manifest.Warning{Err: fmt.Errorf("%s: %s; read as it is (it never ended with a newline)", name, reason)})
	}
	e.id, e.objs, e.good, e.failed, e.held = id, objs, true, nil, ""
	e.newline = len(data) > 0 && data[len(data)-1] == '\n'
	e.racy = s.racy(id)
	return true, errs
}

// hold keeps a file that looks cut short at its previous contents while it
// may still be being written. Once it was left so for holdFor, it is a
// failure (kept so until it changes), unless the only sign was a missing
// final newline and the file never had one: then it is read as it is.
func (s *fileSet) hold(name string, e *fileEntry, id fileID, reason string, strong bool) (held bool, problems []error) {
	now := time.Now()
	if e.held == "" || e.heldID != id {
		e.heldID, e.heldSince = id, now
		if s.holdFor > 0 {
			problems = []error{&manifest.Warning{Err: fmt.Errorf("%s: %s: taken as still being written; keeping its previous contents, reading it again in %v",
				name, reason, s.holdFor)}}
		}
	}
	if now.Sub(e.heldSince) < s.holdFor {
		// This version, not an earlier one, is what the file is now.
		e.held, e.failed, e.failedID = reason, nil, fileID{}
		return true, problems
	}
	if !strong && !e.newline {
		return false, problems
	}
	e.held, e.failedID = "", id
	e.failed = &FileError{Path: name, Err: fmt.Errorf("%s, and unchanged for %v: cut short? kept at its previous contents until it changes (write state files atomically: a temporary file renamed over the old one)",
		reason, s.holdFor)}
	return true, problems
}

// readManifest reads a regular file of at most MaxFileSize bytes. The file
// is opened without blocking (a FIFO would block the open until a writer
// comes) and checked on the opened descriptor, so what is read is what was
// checked.
func readManifest(name string) ([]byte, fileID, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fileID{}, fmt.Errorf("opening manifest: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileID{}, fmt.Errorf("reading manifest: %w", err)
	}
	// What the file is, not how reading went: it comes with its identity,
	// so that it is not read again until it changes.
	id, _ := idOf(fi)
	if !fi.Mode().IsRegular() {
		return nil, id, fmt.Errorf("%s, not a regular file: not read", describeType(fi.Mode()))
	}
	if fi.Size() > MaxFileSize {
		return nil, id, fmt.Errorf("%d bytes, more than the %d a manifest may have, not read", fi.Size(), MaxFileSize)
	}
	// Read at most one byte more than allowed: the file may grow.
	data := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fileID{}, fmt.Errorf("reading manifest: %w", err)
		}
		if len(data) > MaxFileSize {
			return nil, fileID{}, fmt.Errorf("grew past the %d bytes a manifest may have, not read", MaxFileSize)
		}
		if len(data) == cap(data) {
			data = slices.Grow(data, min(cap(data), MaxFileSize+1-len(data)))
		}
	}
	return data, id, nil
}

func describeType(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// apply feeds the Builder the objects whose definition changed, given the
// files in name order. An object defined twice takes the later definition.
// It returns the problems met and the Services no file defines any more.
func (s *fileSet) apply(names []string) ([]error, []removedService) {
	var problems []error
	next := make(map[objectRef]manifest.Object, len(s.current))
	for _, name := range names {
		for _, o := range s.files[name].objs {
			ref, ok := refOf(o)
			if !ok {
				problems = append(problems, &manifest.Warning{Err: fmt.Errorf("%s: unexpected object type %T, skipped", o.Source, o.Obj)})
				continue
			}
			if first, dup := next[ref]; dup && (s.current[ref].Obj != o.Obj) {
				problems = append(problems, &manifest.Warning{Err: fmt.Errorf("%s: %s %s is also defined at %s; this later one wins",
					o.Source, ref.kind, kube.ObjectName(ref.namespace, ref.name), first.Source)})
			}
			next[ref] = o
		}
	}
	for ref, o := range next {
		if s.current[ref].Obj == o.Obj {
			continue
		}
		for _, e := range kube.SplitErrors(upsert(s.b, o.Obj)) {
			problems = append(problems, fmt.Errorf("%s: %w", o.Source, e))
		}
	}
	var removed []removedService
	for ref, o := range s.current {
		if _, ok := next[ref]; !ok {
			remove(s.b, ref)
			if ref.kind == "service" {
				removed = append(removed, removedService{ref.namespace, ref.name, o.Source})
			}
		}
	}
	slices.SortFunc(removed, func(a, b removedService) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	s.current = next
	return problems, removed
}

// objectRef names an object the files define, keyed as the Builder keys it.
type objectRef struct{ kind, namespace, name string }

func refOf(o manifest.Object) (objectRef, bool) {
	switch obj := o.Obj.(type) {
	case *corev1.Service:
		return objectRef{"service", kube.NamespaceOrDefault(obj.Namespace), obj.Name}, true
	case *discoveryv1.EndpointSlice:
		return objectRef{"endpointslice", kube.NamespaceOrDefault(obj.Namespace), obj.Name}, true
	case *corev1.Node:
		return objectRef{"node", "", obj.Name}, true
	case *networkingv1.ServiceCIDR:
		return objectRef{"servicecidr", "", obj.Name}, true
	}
	return objectRef{}, false
}

func upsert(b *kube.Builder, obj any) error {
	switch obj := obj.(type) {
	case *corev1.Service:
		return b.UpsertService(obj)
	case *discoveryv1.EndpointSlice:
		return b.UpsertEndpointSlice(obj)
	case *corev1.Node:
		return b.UpsertNode(obj)
	case *networkingv1.ServiceCIDR:
		return b.UpsertServiceCIDR(obj)
	}
	return nil
}

func remove(b *kube.Builder, ref objectRef) {
	switch ref.kind {
	case "service":
		b.DeleteService(ref.namespace, ref.name)
	case "endpointslice":
		b.DeleteEndpointSlice(ref.namespace, ref.name)
	case "node":
		b.DeleteNode(ref.name)
	case "servicecidr":
		b.DeleteServiceCIDR(ref.name)
	}
}
