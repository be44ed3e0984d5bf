// Package ipvsnltest helps tests that need IPVS: a network namespace of
// their own with a Conn in it, the commands that build a table, and tables
// compared as text.
package ipvsnltest

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// NewNetns makes a network namespace with lo up and returns a path to it
// that netns.Do and Dial take. It lives as long as the test; the test is
// skipped when the kernel has no IPVS.
func NewNetns(t testing.TB) string {
	t.Helper()
	vmguest.RequireIPVS(t)
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result)
	go func() {
		// The thread ends up in the new namespace: it dies with the
		// goroutine (no UnlockOSThread), never back in the pool.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			err = setLoopbackUp()
		}
		done <- result{f, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("making a network namespace: %v", r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), r.f.Fd())
}

// setLoopbackUp sets lo up in the calling thread's namespace.
func setLoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// DialNew opens a Conn in a namespace of its own (NewNetns), as Dial
// does, and returns it with the namespace's path.
func DialNew(t testing.TB) (*ipvsnl.Conn, string) {
	t.Helper()
	ns := NewNetns(t)
	c := Dial(t, ns)
	return c, ns
}

// Dial opens a Conn in the namespace at ns, closed when the test ends; a
// Dial that does not answer within 20 s fails the test instead of hanging
// it.
func Dial(t testing.TB, ns string) *ipvsnl.Conn {
	t.Helper()
	type result struct {
		c   *ipvsnl.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ipvsnl.Dial(ns)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Dial: %v", r.err)
		}
		t.Cleanup(func() { r.c.Close() })
		return r.c
	case <-time.After(20 * time.Second):
		t.Fatalf("Dial(%q) did not return in 20 s", ns)
	}
	return nil
}

// CreateOps are the commands that create vss.
func CreateOps(vss []ipvsnl.VirtualServer) []ipvsnl.Op {
	var ops []ipvsnl.Op
	for _, v := range vss {
		ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewService, Service: v.Service})
		for _, d := range v.Dests {
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewDest, Service: v.Service, Dest: d})
		}
	}
	return ops
}

// Normalize sorts services and their real servers, as Read does.
func Normalize(vss []ipvsnl.VirtualServer) []ipvsnl.VirtualServer {
	out := slices.Clone(vss)
	for i := range out {
		out[i].Dests = slices.Clone(out[i].Dests)
		slices.SortFunc(out[i].Dests, func(a, b ipvsnl.Dest) int { return a.Addr.Compare(b.Addr) })
		if out[i].Dests == nil {
			out[i].Dests = []ipvsnl.Dest{}
		}
	}
	slices.SortFunc(out, func(a, b ipvsnl.VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	return out
}

// dump is one line per virtual server and per real server.
func dump(vss []ipvsnl.VirtualServer) string {
	var b strings.Builder
	for _, v := range vss {
		fmt.Fprintf(&b, "%s %s flags=%#x timeout=%d mask=%#x\n", v.ServiceKey, v.Scheduler, v.Flags, v.Timeout, v.Netmask)
		for _, d := range v.Dests {
			fmt.Fprintf(&b, "  -> %s w=%d fwd=%d active=%d inactive=%d\n", d.Addr, d.Weight, d.Fwd, d.Active, d.Inactive)
		}
	}
	return b.String()
}

// SameTables fails t when got (read back) is not want, both taken in
// Normalize's order.
func SameTables(t testing.TB, what string, got, want []ipvsnl.VirtualServer) {
	t.Helper()
	if g, w := dump(Normalize(got)), dump(Normalize(want)); g != w {
		t.Errorf("%s: read back\n%s\nwant\n%s", what, g, w)
	}
}

// MustApply applies ops through k and fails t on any error.
func MustApply(t testing.TB, k ipvsnl.Kernel, ops []ipvsnl.Op) {
	t.Helper()
	errs, err := k.Apply(ops)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("%s: %v", ops[i], e)
		}
	}
}
