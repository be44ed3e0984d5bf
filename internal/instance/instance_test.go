package instance

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// helperEnv makes the test binary, started again by startHelper, play a
// process of a test (runHelper) instead of running the tests.
const (
	helperEnv     = "KNP_INSTANCE_HELPER"
	helperSquat   = "squat"
	helperHold    = "hold"
	helperSocket  = "hold-socket"
	helperTry     = "try-socket"
	nobody        = 65534
	helperTimeout = 10 * time.Second
)

// init keeps the main thread to the main goroutine: startIn changes the
// thread it runs on for good (its network namespace, its capabilities),
// and that must never be the main thread, whose capabilities
// /proc/<pid>/status reports: the test process would look like a
// holder without CAP_NET_ADMIN (it did, in the 5.10 VM).
func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

// runHelper is a process of a test, in the network namespace it was
// started in. squat: a process that binds the abstract socket as a proxy
// of older versions took it, and tries the lock itself, without being
// able to run a proxy. hold: a proxy's lock. It prints one line saying
// what it got, then holds it until its stdin closes or it is killed.
func runHelper(mode string) int {
	var report string
	switch mode {
	case helperSquat:
		fd, err := squat()
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		defer unix.Close(fd)
		// The lock itself: refused without CAP_NET_ADMIN.
		_, err = acquire("")
		netAdmin, _ := statusHasCapNetAdmin("/proc/self/status") // its pid may be another namespace's
		report = fmt.Sprintf("squatting uid=%d net_admin=%v lock_refused=%v", os.Getuid(), netAdmin, errors.Is(err, os.ErrPermission))
	case helperHold, helperSocket:
		take := map[string]func(string) (*Lock, error){helperHold: acquire, helperSocket: acquireSocket}[mode]
		l, err := take("")
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		defer l.Release()
		report = "held"
	case helperTry:
		l, err := acquireSocket("")
		if err != nil {
			report = "refused: " + err.Error()
			break
		}
		defer l.Release()
		report = "started: " + l.Squatted
	default:
		fmt.Println("error: unknown helper mode", mode)
		return 1
	}
	fmt.Println(report)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// squat binds and listens on the abstract socket of the start-up lock.
func squat() (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + Name}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding @%s: %w", Name, err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// dropCapNetAdmin takes CAP_NET_ADMIN from this thread and what it
// executes (a root process without it, as a container's root often is).
func dropCapNetAdmin() error {
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_NET_ADMIN, 0, 0, 0); err != nil {
		return fmt.Errorf("dropping CAP_NET_ADMIN from the bounding set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	const bit = 1 << unix.CAP_NET_ADMIN
	data[0].Effective &^= bit
	data[0].Permitted &^= bit
	data[0].Inheritable &^= bit
	return unix.Capset(&hdr, &data[0])
}

// helper is a process startHelper started, and the line it printed.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	report string
}

// process says how startHelper starts a helper: as uid (root: 0), without
// CAP_NET_ADMIN, in a pid namespace of its own.
type process struct {
	uid                  uint32
	noNetAdmin, newPidNS bool
}

// startHelper starts the test binary as a helper process in namespace
// ns, as p says, and waits for its report. The helper is killed when the
// test ends.
func startHelper(t *testing.T, ns, mode string, p process) *helper {
	t.Helper()
	// The child runs this binary through /proc/self/exe, which another
	// uid can execute without reaching the build directory.
	cmd := exec.Command("/proc/self/exe")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	// No Pdeathsig: the thread that forks it ends at once. A helper ends
	// when its stdin closes, with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.uid}}
	if p.newPidNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := startIn(ns, p.noNetAdmin, cmd); err != nil {
		t.Fatalf("starting the %s helper: %v", mode, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case line := <-lines:
		return &helper{cmd: cmd, stdin: stdin, report: line}
	case <-time.After(helperTimeout):
		t.Fatalf("the %s helper said nothing within %v", mode, helperTimeout)
		return nil
	}
}

// startIn starts cmd in namespace ns, without CAP_NET_ADMIN when asked:
// a child gets the namespaces and capabilities of the thread that forks
// it, so it is forked from a thread of its own, which ends with it (a
// goroutine that exits locked to its thread takes the thread along).
func startIn(ns string, noNetAdmin bool, cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is changed for good
		errc <- func() error {
			f, err := os.Open(testns.Path(ns))
			if err != nil {
				return err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return err
			}
			if noNetAdmin {
				if err := dropCapNetAdmin(); err != nil {
					return err
				}
			}
			return cmd.Start()
		}()
	}()
	return <-errc
}

// ownedTables reports whether the kernel has owned tables (5.12+); if
// not, the lock is the abstract socket.
func ownedTables(t *testing.T, ns string) bool {
	t.Helper()
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close() // deletes the table
	b := k.NewTx()
	b.AddOwnedTable(nftlib.IPv4, "knp-owned-probe", "")
	err = k.CommitTx(b)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// squatters are processes that cannot run a proxy.
var squatters = []struct {
	name string
	process
}{
	{"uid 65534 without capabilities", process{uid: nobody}},
	{"root without CAP_NET_ADMIN", process{noNetAdmin: true}},
}

// startSquatter starts a squatter in ns and checks what it says: it holds
// the abstract socket, and the lock's table was refused to it.
func startSquatter(t *testing.T, ns string, p process) *helper {
	t.Helper()
	sq := startHelper(t, ns, helperSquat, p)
	if want := fmt.Sprintf("squatting uid=%d net_admin=false lock_refused=true", p.uid); sq.report != want {
		t.Fatalf("the squatter reported %q, want %q", sq.report, want)
	}
	return sq
}

// A process that cannot run a proxy (no CAP_NET_ADMIN: an unprivileged
// uid, or root without the capability) cannot stop one from starting,
// whatever it binds first; two proxies still exclude each other.
func TestKernelLockSquatted(t *testing.T) {
	for _, tc := range squatters {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-lock-")
			if !ownedTables(t, ns) {
				t.Skip("no owned nftables tables (Linux 5.12+): the lock is the abstract socket (TestKernelLockSocketSquatted)")
			}
			sq := startSquatter(t, ns, tc.process)
			l, err := acquire(testns.Path(ns))
			if err != nil {
				t.Fatalf("a squatter (pid %d) stops the proxy from starting: %v", sq.cmd.Process.Pid, err)
			}
			defer l.Release()
			_, err = acquire(testns.Path(ns))
			wantHeldBy(t, err, os.Getpid())
		})
	}
}

// On kernels without owned tables a squatter of the abstract socket does
// not stop the proxy either: it cannot answer the challenge, so the proxy
// starts without the lock and says who squats it. A second proxy is still
// refused: the first holds the socket and answers.
func TestKernelLockSocketSquatted(t *testing.T) {
	for _, tc := range squatters {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-lock-")
			sq := startSquatter(t, ns, tc.process)
			want := fmt.Sprintf("held by pid %d (uid %d), which has no CAP_NET_ADMIN, so not by a kube-nftproxy", sq.cmd.Process.Pid, tc.uid)
			l, err := acquireSocket(testns.Path(ns))
			if err != nil || !strings.Contains(l.Squatted, want) {
				t.Fatalf("acquire = %+v, %v; want to start, saying %q", l, err, want)
			}
			l.Release()
		})
	}
}

// Where the holder of the abstract socket is in another pid namespace (a
// pod of the node's network, not ours), its capabilities cannot be read:
// the challenge alone tells a proxy, which refuses the second one, from a
// squatter, which does not stop it.
func TestKernelLockSocketChallenge(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		holder     process
		want       string
	}{
		{"a proxy", helperSocket, process{newPidNS: true},
			"refused: another kube-nftproxy is running in this network namespace (a process in another pid namespace, which holds"},
		{"a squatter", helperSquat, process{uid: nobody, newPidNS: true},
			"started: the start-up lock, abstract socket @kube-nftproxy, is held by a process in another pid namespace, which did not answer as a kube-nftproxy does"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-lock-")
			startHelper(t, ns, tc.mode, tc.holder)
			try := startHelper(t, ns, helperTry, process{newPidNS: true})
			if !strings.HasPrefix(try.report, tc.want) {
				t.Fatalf("a proxy in a sibling pid namespace: %q, want %q", try.report, tc.want)
			}
		})
	}
}

// A proxy killed with SIGKILL leaves no lock behind.
func TestKernelLockHolderKilled(t *testing.T) {
	ns := testns.New(t, "knp-lock-")
	h := startHelper(t, ns, helperHold, process{})
	if h.report != "held" {
		t.Fatalf("the holder reported %q", h.report)
	}
	_, err := acquire(testns.Path(ns))
	wantHeldBy(t, err, h.cmd.Process.Pid)
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	var l *Lock
	testutil.WaitFor(t, 5*time.Second, "the lock of a killed holder to be free", func() bool {
		l, err = acquire(testns.Path(ns))
		return err == nil
	})
	l.Release()
}

// A lock given back is free again.
func TestKernelLockReleased(t *testing.T) {
	ns := testns.New(t, "knp-lock-")
	first, err := acquire(testns.Path(ns))
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	_, err = acquire(testns.Path(ns))
	wantHeldBy(t, err, os.Getpid())
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := acquire(testns.Path(ns))
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Release()
}

// A refused attempt (a second proxy, --cleanup while one runs) commits
// nothing, so a running proxy's change monitor has nothing to see.
func TestKernelLockRefusalCommitsNothing(t *testing.T) {
	if !ownedTables(t, testns.New(t, "knp-lock-")) {
		t.Skip("no owned nftables tables (Linux 5.12+): the holder of the abstract socket answers each attempt with a transaction of its own table (TestKernelLockSocketChallenge)")
	}
	ns := testns.New(t, "knp-lock-")
	l, err := acquire(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	before, err := k.Generation()
	if err != nil {
		t.Fatal(err)
	}
	_, err = acquire(testns.Path(ns))
	wantHeldBy(t, err, os.Getpid())
	if after, err := k.Generation(); err != nil || after != before {
		t.Errorf("nftables generation %d -> %d (%v) after a refused attempt: something was committed", before, after, err)
	}
}

// The lock is readable in `nft list ruleset`, and goes with its holder.
func TestKernelLockListed(t *testing.T) {
	ns := testns.New(t, "knp-lock-")
	if !ownedTables(t, ns) {
		t.Skip("no owned nftables tables (Linux 5.12+): the lock is the abstract socket")
	}
	l, err := acquire(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	got := testns.NFT(t, ns, "list", "ruleset")
	for _, want := range []string{
		"table ip kube-nftproxy-lock {",
		"flags owner",
		fmt.Sprintf(`comment "kube-nftproxy instance lock, held by pid %d: one proxy per network namespace; deleted when it exits"`, os.Getpid()),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("nft list ruleset lacks %q:\n%s", want, got)
		}
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); got != "" {
		t.Errorf("after Release, nft list ruleset still shows:\n%s", got)
	}
}

// A lock table that no process owns (made with nft) is nobody's lock:
// the error says so and how to remove it.
func TestKernelLockTableWithoutOwner(t *testing.T) {
	ns := testns.New(t, "knp-lock-")
	testns.NFTScript(t, ns, "add table ip kube-nftproxy-lock { comment \"kube-nftproxy instance lock, held by pid 1\"; }\n")
	_, err := acquire(testns.Path(ns))
	if err == nil || errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "nft delete table ip kube-nftproxy-lock") {
		t.Fatalf("acquire = %v, want an error saying how to delete the table", err)
	}
}

// On kernels without owned tables the abstract socket is the lock.
func TestKernelLockSocketFallback(t *testing.T) {
	ns := testns.New(t, "knp-lock-")
	first, err := acquireSocket(testns.Path(ns))
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	// Each attempt is answered at once: the holder takes the connections
	// that ask who it is, which would otherwise fill its queue.
	done := make(chan error, 1)
	go func() {
		for range 10 {
			if _, err := acquireSocket(testns.Path(ns)); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("an attempt while the lock is held: %v, want ErrRunning naming pid %d", err, os.Getpid())
		}
	case <-time.After(helperTimeout):
		t.Fatalf("10 attempts while the lock is held did not end within %v", helperTimeout)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := acquireSocket(testns.Path(ns))
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Release()
}

// wantHeldBy fails t unless err is ErrRunning naming pid.
func wantHeldBy(t *testing.T, err error, pid int) {
	t.Helper()
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("second lock: %v, want ErrRunning naming pid %d", err, pid)
	}
}
