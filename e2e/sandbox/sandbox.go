// Package sandbox builds the network-namespace topology of e2e/TOPOLOGY.md
// (a node with a pod bridge, pods, an off-cluster client) for kernel tests
// and the demo, and runs commands inside it with `ip netns exec`.
//
// Everything lives in namespaces named with a random prefix
// ("knp-1a2b3c-node", ...); nothing is created in the caller's namespace.
// Close deletes it all. A sandbox whose owner died without Close is swept by
// the next New.
//
// Creating a sandbox needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure New. The zero value gives the topology of TOPOLOGY.md.
type Options struct {
	// Pods are the pod namespaces to create; nil means DefaultPods.
	Pods []Pod
	// Logf, if set, receives progress messages and, line by line, the
	// output of processes started with Start. Pass t.Logf in tests.
	Logf func(format string, args ...any)
	// ReadyTimeout bounds the wait for links and addresses to come up
	// (default 10s).
	ReadyTimeout time.Duration
	// StopTimeout is how long Close lets a process run after SIGTERM
	// before it sends SIGKILL (default 5s).
	StopTimeout time.Duration
}

// newHook, if set (by tests), learns each new sandbox's prefix first.
var newHook func(prefix string)

// Sandbox is a running topology. Its methods are safe for concurrent use.
type Sandbox struct {
	prefix string
	pods   []Pod
	opts   Options
	ipCmd  string
	lock   *lock

	mu         sync.Mutex
	namespaces []string // logical names, in creation order
	procs      []*Process
	closed     bool
	closeOnce  sync.Once
	closeErr   error
}

// New creates the namespaces, links, addresses and routes and waits until
// every link is up and every address usable. On error nothing is left
// behind. ctx bounds the setup only.
func New(ctx context.Context, opts Options) (*Sandbox, error) {
	if opts.Pods == nil {
		opts.Pods = DefaultPods()
	}
	if err := validatePods(opts.Pods); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("sandbox: need root to create network namespaces")
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 5 * time.Second
	}
	ipCmd, err := exec.LookPath("ip")
	if err != nil {
		return nil, fmt.Errorf("sandbox: iproute2 is needed: %w", err)
	}

	sweepStale(ctx, ipCmd, opts.Logf)

	var (
		id   string
		lock *lock
	)
	for range 3 { // a clash of random ids is unlikely, twice more so
		if id, err = randomID(); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		if lock, err = acquireLock(id); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if newHook != nil {
		newHook(namePrefix + id + "-")
	}
	s := &Sandbox{
		prefix: namePrefix + id + "-",
		pods:   append([]Pod(nil), opts.Pods...),
		opts:   opts,
		ipCmd:  ipCmd,
		lock:   lock,
	}
	if err := s.setup(ctx); err != nil {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.logf("sandbox %s ready: %s", s.prefix, strings.Join(s.Namespaces(), ", "))
	return s, nil
}

// Prefix is the prefix of every namespace name, e.g. "knp-1a2b3c-".
func (s *Sandbox) Prefix() string { return s.prefix }

// NS returns the real name of a sandbox namespace ("node", "client" or a
// pod name), e.g. "knp-1a2b3c-node", for use with `ip netns exec`. It
// returns "" for names that are not part of the sandbox.
func (s *Sandbox) NS(name string) string {
	if !s.known(name) {
		return ""
	}
	return s.prefix + name
}

// Namespaces lists the logical names of the sandbox's namespaces.
func (s *Sandbox) Namespaces() []string {
	names := []string{Node}
	for _, p := range s.pods {
		names = append(names, p.Name)
	}
	return append(names, Client)
}

// Pods returns the sandbox's pods.
func (s *Sandbox) Pods() []Pod { return append([]Pod(nil), s.pods...) }

// Pod returns the pod with the given name.
func (s *Sandbox) Pod(name string) (Pod, bool) {
	for _, p := range s.pods {
		if p.Name == name {
			return p, true
		}
	}
	return Pod{}, false
}

func (s *Sandbox) known(name string) bool {
	if name == Node || name == Client {
		return true
	}
	_, ok := s.Pod(name)
	return ok
}

// Command returns, unstarted, the command args run inside namespace ns
// (a logical name, see NS) via `ip netns exec`. The command gets its own
// process group and is killed if the calling thread dies; ctx kills it
// with SIGTERM (SIGKILL after StopTimeout). An unknown ns is reported by
// the command's Err, i.e. by Run or Start.
func (s *Sandbox) Command(ctx context.Context, ns string, args ...string) *exec.Cmd {
	real := s.NS(ns)
	cmd := exec.CommandContext(ctx, s.ipCmd, append([]string{"netns", "exec", real}, args...)...)
	switch {
	case real == "":
		cmd.Err = fmt.Errorf("sandbox %s: no namespace %q", s.prefix, ns)
	case len(args) == 0:
		cmd.Err = fmt.Errorf("sandbox %s: no command to run in %s", s.prefix, ns)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return signalGroup(cmd.Process, syscall.SIGTERM) }
	cmd.WaitDelay = s.opts.StopTimeout
	return cmd
}

// Exec runs args inside namespace ns and returns its standard output. On
// failure the error carries the command, its exit status and its standard
// error, and the output so far is still returned.
func (s *Sandbox) Exec(ctx context.Context, ns string, args ...string) ([]byte, error) {
	cmd := s.Command(ctx, ns, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), cmdError(ns+": "+strings.Join(args, " "), err, stderr.Bytes())
}

// Start starts args in the background inside namespace ns. Its output goes
// to Options.Logf, line by line, prefixed with the namespace and the
// command's base name. Close stops it if it is still running.
func (s *Sandbox) Start(ctx context.Context, ns string, args ...string) (*Process, error) {
	cmd := s.Command(ctx, ns, args...)
	if s.opts.Logf != nil && len(args) > 0 {
		w := &lineWriter{prefix: ns + "/" + baseName(args[0]) + ": ", logf: s.opts.Logf}
		cmd.Stdout, cmd.Stderr = w, w
	}
	return s.StartCmd(ns, cmd)
}

// StartCmd starts cmd, normally built with Command and given its own
// Stdout, Stderr or Env, and tracks it like Start does. ns only names the
// process in messages.
func (s *Sandbox) StartCmd(ns string, cmd *exec.Cmd) (*Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("sandbox %s is closed", s.prefix)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", ns, strings.Join(cmdArgs(cmd), " "), err)
	}
	p := newProcess(ns, cmd)
	s.procs = append(s.procs, p)
	return p, nil
}

// Close stops the processes started with Start that are still running
// (SIGTERM, then SIGKILL after StopTimeout) and deletes every namespace, and
// with them all links. It is safe to call more than once; later calls
// return the first call's result.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Sandbox) close() error {
	s.mu.Lock()
	s.closed = true
	procs := s.procs
	namespaces := s.namespaces
	s.mu.Unlock()

	var (
		errs   []error
		errsMu sync.Mutex
		wg     sync.WaitGroup
	)
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The exit status is the starter's business; only a
			// process that outlives SIGKILL is Close's.
			if err := p.Stop(s.opts.StopTimeout); errors.Is(err, errStuck) {
				errsMu.Lock()
				errs = append(errs, err)
				errsMu.Unlock()
			}
		}()
	}
	wg.Wait()

	// A fresh context: Close must work after the caller's was cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := len(namespaces) - 1; i >= 0; i-- {
		real := s.prefix + namespaces[i]
		if err := s.ip(ctx, "netns", "delete", real); err != nil && nsExists(real) {
			errs = append(errs, err)
		}
	}
	if left, err := listNamespaces(); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range left {
			if strings.HasPrefix(n, s.prefix) {
				errs = append(errs, fmt.Errorf("namespace %s is still there", n))
			}
		}
	}
	if len(errs) == 0 {
		s.lock.release()
	} else {
		// Keep the lock file; the next New's sweep retries.
		s.lock.unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox %s: close: %w", s.prefix, err)
	}
	s.logf("sandbox %s deleted", s.prefix)
	return nil
}

func (s *Sandbox) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// ip runs the ip command in the caller's namespace (only ever with -n or
// netns subcommands, so that nothing outside the sandbox is touched).
func (s *Sandbox) ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, s.ipCmd, args...).CombinedOutput()
	return cmdError("ip "+strings.Join(args, " "), err, out)
}

// ipIn runs `ip -n NS args...` for a logical namespace.
func (s *Sandbox) ipIn(ctx context.Context, ns string, args ...string) error {
	return s.ip(ctx, append([]string{"-n", s.prefix + ns}, args...)...)
}

// ipJSON runs `ip -j -n NS args...` and returns its output.
func (s *Sandbox) ipJSON(ctx context.Context, ns string, args ...string) ([]byte, error) {
	args = append([]string{"-j", "-n", s.prefix + ns}, args...)
	out, err := exec.CommandContext(ctx, s.ipCmd, args...).Output()
	var stderr []byte
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		stderr = ee.Stderr
	}
	return out, cmdError("ip "+strings.Join(args, " "), err, stderr)
}

// cmdError wraps a command's error with the command and its (trimmed)
// standard error; nil stays nil.
func cmdError(what string, err error, stderr []byte) error {
	if err == nil {
		return nil
	}
	if msg := strings.TrimSpace(string(stderr)); msg != "" {
		return fmt.Errorf("%s: %w: %s", what, err, msg)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func randomID() (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func baseName(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// cmdArgs strips "ip netns exec NS" from a Command's arguments.
func cmdArgs(cmd *exec.Cmd) []string {
	if len(cmd.Args) > 4 && cmd.Args[1] == "netns" && cmd.Args[2] == "exec" {
		return cmd.Args[4:]
	}
	return cmd.Args
}
