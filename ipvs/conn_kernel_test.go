package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Kernel tests: they need IPVS (run them with hack/vm/run.sh ./ipvs) and
// each makes its own network namespace, IPVS state being per netns.

// newNetns makes a network namespace and returns a path to it that
// netns.Do and Dial take. It lives as long as the test.
func newNetns(t testing.TB) string {
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

// dialKernel opens a Conn in a new namespace; a Dial that does not answer
// within 20 s fails the test instead of hanging it.
func dialKernel(t testing.TB) (*Conn, string) {
	t.Helper()
	ns := newNetns(t)
	c := dialIn(t, ns)
	return c, ns
}

func dialIn(t testing.TB, ns string) *Conn {
	t.Helper()
	type result struct {
		c   *Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Dial(ns)
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

func svc(addr string, p proxier.Protocol, port uint16, sched string) Service {
	a := netip.MustParseAddr(addr)
	s := Service{ServiceKey: ServiceKey{Addr: a, Protocol: p, Port: port}, Scheduler: sched, Netmask: 0xffffffff}
	if a.Is6() {
		s.Netmask = 128
	}
	return s
}

func dest(ap string, w uint32) Dest {
	return Dest{Addr: netip.MustParseAddrPort(ap), Weight: w, Fwd: FwdMasq}
}

// opsFor are the commands that create vss.
func opsFor(vss []VirtualServer) []Op {
	var ops []Op
	for _, v := range vss {
		ops = append(ops, Op{Cmd: CmdNewService, Service: v.Service})
		for _, d := range v.Dests {
			ops = append(ops, Op{Cmd: CmdNewDest, Service: v.Service, Dest: d})
		}
	}
	return ops
}

// normalize sorts services and their real servers, as FakeKernel.Read does.
func normalize(vss []VirtualServer) []VirtualServer {
	out := slices.Clone(vss)
	for i := range out {
		out[i].Dests = slices.Clone(out[i].Dests)
		slices.SortFunc(out[i].Dests, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
		if out[i].Dests == nil {
			out[i].Dests = []Dest{}
		}
	}
	slices.SortFunc(out, func(a, b VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	return out
}

func dump(vss []VirtualServer) string {
	var b strings.Builder
	for _, v := range vss {
		fmt.Fprintf(&b, "%s %s flags=%#x timeout=%d mask=%#x\n", v.ServiceKey, v.Scheduler, v.Flags, v.Timeout, v.Netmask)
		for _, d := range v.Dests {
			fmt.Fprintf(&b, "  -> %s w=%d fwd=%d active=%d inactive=%d\n", d.Addr, d.Weight, d.Fwd, d.Active, d.Inactive)
		}
	}
	return b.String()
}

// sameTables fails t when got (read back) is not want.
func sameTables(t testing.TB, what string, got, want []VirtualServer) {
	t.Helper()
	if g, w := dump(normalize(got)), dump(normalize(want)); g != w {
		t.Errorf("%s: read back\n%s\nwant\n%s", what, g, w)
	}
}

// keysOnly drops the settings /proc/net/ip_vs does not give in our terms.
func keysOnly(vss []VirtualServer) []VirtualServer {
	out := make([]VirtualServer, len(vss))
	for i, v := range vss {
		out[i] = VirtualServer{Service: Service{ServiceKey: v.ServiceKey}, Dests: v.Dests}
	}
	return out
}

var allSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"}

// roundTripTable: both families, the three protocols, every scheduler
// upstream accepts (mh with its flag), persistence with a timeout and a
// netmask other than the one-client default, weights from 0 to the largest.
func roundTripTable() []VirtualServer {
	var vss []VirtualServer
	for i, sched := range allSchedulers {
		for _, fam := range []struct{ vip, rs string }{{"10.96.0.%d", "10.244.%d.%d"}, {"fd00::%x", "fd00:10:244:%x::%x"}} {
			for j, p := range []proxier.Protocol{proxier.TCP, proxier.UDP, proxier.SCTP} {
				s := svc(fmt.Sprintf(fam.vip, 10+i), p, uint16(80+j), sched)
				if sched == "mh" {
					s.Flags |= FlagSched2
				}
				if i%3 == 1 {
					s.Flags |= FlagPersistent
					s.Timeout = uint32(10800 + i)
					if s.Addr.Is4() {
						s.Netmask = 0xffffff00
					} else {
						s.Netmask = 64
					}
				}
				v := VirtualServer{Service: s}
				for k := range 3 {
					rs := fmt.Sprintf(fam.rs, i, k+2)
					if s.Addr.Is6() {
						rs = "[" + rs + "]"
					}
					w := uint32(k + 1)
					switch {
					case k == 2 && i == 0:
						w = maxWeight
					case k == 2 && i == 1:
						w = 0
					}
					v.Dests = append(v.Dests, dest(fmt.Sprintf("%s:%d", rs, 8080+j), w))
				}
				vss = append(vss, v)
			}
		}
	}
	return vss
}

func TestKernelRoundTrip(t *testing.T) {
	c, ns := dialKernel(t)
	want := roundTripTable()
	fake := NewFakeKernel()
	apply := func(what string, ops []Op) {
		t.Helper()
		for name, k := range map[string]Kernel{"kernel": c, "fake": fake} {
			errs, err := k.Apply(ops)
			if err != nil {
				t.Fatalf("%s: %s: %v", what, name, err)
			}
			for i, e := range errs {
				if e != nil {
					t.Errorf("%s: %s: %s: %v", what, name, ops[i], e)
				}
			}
		}
	}
	check := func(what string) {
		t.Helper()
		got, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		sameTables(t, what+": Read", got, want)
		sameTables(t, what+": FakeKernel.Read", fake.Snapshot(), want)
		for _, v := range want {
			ds, err := c.Dests(v.ServiceKey)
			if err != nil {
				t.Fatalf("Dests(%s): %v", v.ServiceKey, err)
			}
			sameTables(t, what+": Dests", []VirtualServer{{Service: v.Service, Dests: ds}}, []VirtualServer{v})
		}
		// /proc/net/ip_vs agrees with the netlink dumps.
		var proc map[ServiceKey][]Dest
		if err := netns.Do(ns, func() error {
			f, err := os.Open("/proc/thread-self/net/ip_vs")
			if err != nil {
				return err
			}
			defer f.Close()
			proc, err = parseProcIPVS(f)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var fromProc []VirtualServer
		for k, ds := range proc {
			fromProc = append(fromProc, VirtualServer{Service: Service{ServiceKey: k}, Dests: ds})
		}
		sameTables(t, what+": /proc/net/ip_vs", fromProc, keysOnly(want))
	}

	apply("create", opsFor(want))
	check("created")

	// Change settings of every fourth service, weights of some real
	// servers, delete some real servers and some services.
	var ops []Op
	for i := range want {
		v := &want[i]
		switch i % 4 {
		case 0:
			v.Flags ^= FlagPersistent
			if v.Flags&FlagPersistent != 0 {
				v.Timeout = 60
			} else {
				v.Timeout = 0
			}
			if v.Scheduler != "mh" {
				v.Scheduler = "wrr"
			}
			ops = append(ops, Op{Cmd: CmdSetService, Service: v.Service})
		case 1:
			v.Dests[0].Weight = 7
			ops = append(ops, Op{Cmd: CmdSetDest, Service: v.Service, Dest: v.Dests[0]})
		case 2:
			ops = append(ops, Op{Cmd: CmdDelDest, Service: v.Service, Dest: v.Dests[1]})
			v.Dests = slices.Delete(v.Dests, 1, 2)
		}
	}
	var kept []VirtualServer
	for i, v := range want {
		if i%4 == 3 {
			ops = append(ops, Op{Cmd: CmdDelService, Service: v.Service})
			continue
		}
		kept = append(kept, v)
	}
	want = kept
	apply("update", ops)
	check("updated")
}

// TestKernelScript runs TestFakeScript's script against the kernel.
func TestKernelScript(t *testing.T) {
	c, _ := dialKernel(t)
	runScript(t, c)
}

// Another namespace's services share the kernel's service hash table.
// Debian's 6.1 /proc/net/ip_vs then loses services at read() boundaries
// (seq_next counts every namespace's services into the position, seq_start
// only this one's): Read must still return every real server.
func TestKernelReadBesideOtherNamespace(t *testing.T) {
	other, _ := dialKernel(t)
	c, _ := dialKernel(t)
	var mine, theirs []VirtualServer
	for i := range 400 {
		s := svc(fmt.Sprintf("10.98.%d.%d", i/200, i%200+1), proxier.TCP, 80, "rr")
		theirs = append(theirs, VirtualServer{Service: s, Dests: []Dest{dest("10.244.9.9:80", 1)}})
		s.Port = 81
		mine = append(mine, VirtualServer{Service: s, Dests: []Dest{dest("10.244.0.1:80", 1), dest("10.244.0.2:80", 2)}})
	}
	applyAll(t, other, opsFor(theirs))
	applyAll(t, c, opsFor(mine))
	got, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	sameTables(t, "Read beside another namespace", got, mine)
}
