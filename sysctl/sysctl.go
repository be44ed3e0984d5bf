package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Default roots: the sysctl tree, and the module parameters, where
// nf_conntrack's hash table size is set.
const (
	DefaultRoot = "/proc/sys"
	ModuleRoot  = "/sys/module"
)

// ConntrackHashsize is the key, under ModuleRoot, of nf_conntrack's hash
// table size. The kernel accepts a new value only from a process in the
// initial network namespace, and it applies to all of them.
const ConntrackHashsize = "nf_conntrack/parameters/hashsize"

// ErrReadOnly is wrapped by errors for keys that exist but cannot be written
// here: a read-only mount (EROFS), a key the kernel makes read-only or a
// process without the privilege (a key without write permission, EACCES,
// EPERM), or a write the kernel refuses from this context (EOPNOTSUPP, as
// the conntrack hashsize outside the initial network namespace).
var ErrReadOnly = errors.New("read-only")

// Sysctl reads and writes the keys under one root directory.
type Sysctl struct {
	root    string
	journal *Journal // nil: changes are not remembered
}

// New returns a Sysctl for the keys under root; "" means DefaultRoot.
// Use ModuleRoot for module parameters, a temporary directory in tests.
func New(root string) *Sysctl {
	if root == "" {
		root = DefaultRoot
	}
	return &Sysctl{root: root}
}

// WithJournal returns a Sysctl for the same keys whose changes j
// remembers.
func (s *Sysctl) WithJournal(j *Journal) *Sysctl {
	return &Sysctl{root: s.root, journal: j}
}

// Root is the directory the keys are under.
func (s *Sysctl) Root() string { return s.root }

// Path is the file of key, as Get and Set use it; "" for an invalid key.
func (s *Sysctl) Path(key string) string {
	p, err := s.path(key)
	if err != nil {
		return ""
	}
	return p
}

// path maps a key to its file. Keys are relative paths with "/" between
// the parts ("net/netfilter/nf_conntrack_max"); the sysctl(8) form with
// dots ("net.netfilter.nf_conntrack_max") is accepted when the key has no
// "/" at all. A key must stay under the root.
func (s *Sysctl) path(key string) (string, error) {
	k := key
	if !strings.Contains(k, "/") {
		k = strings.ReplaceAll(k, ".", "/")
	}
	if k == "" || path.IsAbs(k) || path.Clean(k) != k || k == ".." || strings.HasPrefix(k, "../") {
		return "", &Error{Op: "use", Key: key, Path: key, Reason: "not a valid key (want a relative path such as net/netfilter/nf_conntrack_max)"}
	}
	return filepath.Join(s.root, filepath.FromSlash(k)), nil
}

// Get returns the value of key, without surrounding white space.
func (s *Sysctl) Get(key string) (string, error) {
	p, err := s.path(key)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", newError("read", key, p, "", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// GetInt returns the value of key as an integer.
func (s *Sysctl) GetInt(key string) (int, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &Error{Op: "read", Key: key, Path: s.Path(key), Reason: fmt.Sprintf("the value %q is not an integer", v), Err: err}
	}
	return n, nil
}

// Set writes value to key, in one write as the kernel expects. A key that
// exists but has no write permission for anyone is reported as read-only
// without trying (root may write such a file on an ordinary file system,
// never in /proc/sys).
func (s *Sysctl) Set(key, value string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return newError("write", key, p, value, err)
	}
	if fi.IsDir() {
		return &Error{Op: "write", Key: key, Path: p, Value: value, Reason: "a directory, not a key"}
	}
	if fi.Mode().Perm()&0o222 == 0 {
		return &Error{Op: "write", Key: key, Path: p, Value: value, kind: ErrReadOnly,
			Reason: fmt.Sprintf("read-only: the kernel makes this key read-only here (mode %s), as it does for global keys in a network namespace other than the initial one", fi.Mode().Perm())}
	}
	// The value before, for the journal: a key we cannot read is not
	// remembered, as it could not be put back either.
	before, rerr := os.ReadFile(p)
	if err := write(p, key, value); err != nil {
		return err
	}
	if s.journal != nil && rerr == nil {
		s.journal.changed(p, strings.TrimSpace(string(before)), value)
	}
	return nil
}

// write writes value to the file p of key.
func write(p, key, value string) error {
	// No O_CREATE: a missing key is an error, never a new file.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return newError("write", key, p, value, err)
	}
	_, werr := f.Write([]byte(value))
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr != nil {
		return newError("write", key, p, value, werr)
	}
	return nil
}

// SetInt writes the integer v to key.
func (s *Sysctl) SetInt(key string, v int) error {
	return s.Set(key, strconv.Itoa(v))
}

// Error is a failed read or write of a key. It wraps the underlying error
// (so errors.Is(err, fs.ErrNotExist) holds for a key this kernel lacks) and
// ErrReadOnly for a key that cannot be written here.
type Error struct {
	Op     string // "read" or "write"
	Key    string // as given
	Path   string // the file
	Value  string // for writes, the value
	Reason string // why, in words
	Err    error  // the underlying error, if any
	kind   error  // ErrReadOnly, or nil
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Op, e.Path)
	if e.Op == "write" {
		fmt.Fprintf(&b, " = %s", e.Value)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	if e.Err != nil {
		fmt.Fprintf(&b, " (%s)", underlying(e.Err))
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As the underlying error and the kind.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// underlying is err without the path os adds (Error prints the path once).
func underlying(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// newError classifies an error of the file system or the kernel.
func newError(op, key, p, value string, err error) *Error {
	e := &Error{Op: op, Key: key, Path: p, Value: value, Err: err}
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		e.Reason = "no such key in this kernel (the module that provides it may not be loaded, or not be in use in this network namespace)"
	case op == "write" && readOnlyReason(errno) != "":
		e.kind = ErrReadOnly
		e.Reason = readOnlyReason(errno)
	case op == "write" && errno == syscall.EINVAL:
		e.Reason = "the kernel rejected the value"
	case errors.Is(err, fs.ErrPermission):
		e.Reason = "permission denied"
	default:
		e.Reason = "failed"
	}
	return e
}

// readOnlyReason explains a write error that means the key may not be
// changed from here (ErrReadOnly); "" for other errors.
func readOnlyReason(errno syscall.Errno) string {
	switch errno {
	case syscall.EROFS:
		return "read-only: the file system is mounted read-only (as /proc/sys and /sys are in most containers)"
	case syscall.EACCES:
		return "read-only: permission denied (the kernel makes this key read-only here, or the process lacks the privilege)"
	case syscall.EPERM:
		return "read-only: operation not permitted (the process lacks the privilege, e.g. CAP_NET_ADMIN or CAP_SYS_ADMIN)"
	case syscall.EOPNOTSUPP:
		return "read-only: the kernel refuses the change from here (nf_conntrack's hashsize, for one, can only be set from the initial network namespace)"
	}
	return ""
}
