package nftbench

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// change is one API write of the latency workload and the address it
// brings into every node's kernel: a new endpoint's (its DNAT target) or
// a new Service's ClusterIP (its map element).
type change struct {
	service bool // a Service created, else an endpoint replaced
	ip      [4]byte
	at      time.Time // just before the write; zero until then
	done    time.Time // when the write returned
	failed  bool      // the write failed: not measured
}

// awaited is the workload's changes, shared by every node's kernelWatch,
// which look them up by address.
type awaited struct {
	mu      sync.RWMutex
	changes []change
	byIP    map[[4]byte]int
}

func newAwaited() *awaited { return &awaited{byIP: map[[4]byte]int{}} }

// add registers a change before it is written (its notification cannot
// come earlier) and returns its index.
func (a *awaited) add(service bool, ip netip.Addr) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.changes = append(a.changes, change{service: service, ip: ip.As4()})
	a.byIP[ip.As4()] = len(a.changes) - 1
	return len(a.changes) - 1
}

// start records change i's write time, now, and returns it.
func (a *awaited) start(i int) time.Time {
	now := time.Now()
	a.mu.Lock()
	a.changes[i].at = now
	a.mu.Unlock()
	return now
}

// finish records that change i's write returned successfully.
func (a *awaited) finish(i int) {
	a.mu.Lock()
	a.changes[i].done = time.Now()
	a.mu.Unlock()
}

// fail marks change i as not written.
func (a *awaited) fail(i int) {
	a.mu.Lock()
	a.changes[i].failed = true
	delete(a.byIP, a.changes[i].ip)
	a.mu.Unlock()
}

func (a *awaited) lookup(ip [4]byte) (int, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	i, ok := a.byIP[ip]
	return i, ok
}

// snapshot copies the changes registered so far.
func (a *awaited) snapshot() []change {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return append([]change(nil), a.changes...)
}

// kernelWatch follows the nf_tables notifications of one node namespace
// (the NFNLGRP_NFTABLES group: the kernel sends them once a commit is in
// force) and records when each awaited address first arrives in a new
// rule or set element. The time is when the harness read it, so it
// includes the harness's own scheduling delay.
type kernelWatch struct {
	ns   string
	want *awaited
	f    *os.File
	done chan struct{}
	// closed is set before the socket is closed: the reader's error then
	// is only that.
	closed atomic.Bool

	mu   sync.Mutex
	seen map[int]time.Time
	// lost: changes written before the kernel dropped notifications
	// (ENOBUFS) and not seen by then; their first arrival may have been
	// dropped, so a later sighting does not time them.
	lost     map[int]bool
	overruns int
	err      error // the socket failed
}

// watchRcvBuf is each watch's receive buffer: room for the notifications
// of many syncs should the harness fall behind.
const watchRcvBuf = 32 << 20

// watchKernel opens a watch in namespace ns.
func watchKernel(ns string, want *awaited) (*kernelWatch, error) {
	fd, err := netns.NetlinkSocket("/run/netns/"+ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	setup := func() error {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchRcvBuf); err != nil {
			return fmt.Errorf("sizing the receive buffer: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
			return fmt.Errorf("joining the nftables group: %w", err)
		}
		return unix.SetNonblock(fd, true)
	}
	if err := setup(); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching %s: %w", ns, err)
	}
	w := &kernelWatch{ns: ns, want: want, f: os.NewFile(uintptr(fd), "nftables-watch-"+ns),
		done: make(chan struct{}), seen: map[int]time.Time{}, lost: map[int]bool{}}
	rc, err := w.f.SyscallConn()
	if err != nil {
		w.f.Close()
		return nil, err
	}
	go w.run(rc)
	return w, nil
}

// run reads notifications as they come until the socket is closed.
func (w *kernelWatch) run(rc syscall.RawConn) {
	defer close(w.done)
	buf := make([]byte, 1<<17)
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return false
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.ENOBUFS):
				w.overrun(time.Now())
				continue
			case err != nil:
				w.fail(err)
				return true
			}
			w.record(buf[:n], time.Now())
		}
	})
	if err != nil && !w.closed.Load() {
		w.fail(err)
	}
}

func (w *kernelWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// overrun marks the changes written by now and not yet seen as lost.
func (w *kernelWatch) overrun(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.overruns++
	for i, c := range w.want.snapshot() {
		if _, ok := w.seen[i]; !ok && !c.at.IsZero() && !c.at.After(now) {
			w.lost[i] = true
		}
	}
}

// record notes the awaited addresses that the notifications in b carry.
func (w *kernelWatch) record(b []byte, now time.Time) {
	err := scanNewObjects(b, func(word [4]byte) {
		i, ok := w.want.lookup(word)
		if !ok {
			return
		}
		w.mu.Lock()
		if _, ok := w.seen[i]; !ok {
			w.seen[i] = now
		}
		w.mu.Unlock()
	})
	if err != nil {
		w.fail(err)
	}
}

// scanNewObjects calls fn with every 4-byte-aligned word of the nf_tables
// NEWRULE and NEWSETELEM notifications in b. Netlink aligns every
// attribute to 4 bytes, so an address held in a data value (an immediate,
// a comparison, an element's key or data, the first field of a
// concatenation) is one of these words; the same 4 bytes inside a name
// or comment are aligned only by chance.
func scanNewObjects(b []byte, fn func(word [4]byte)) error {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return fmt.Errorf("parsing notifications: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
			continue
		}
		if t := m.Header.Type & 0xff; t != unix.NFT_MSG_NEWRULE && t != unix.NFT_MSG_NEWSETELEM {
			continue
		}
		for i := 0; i+4 <= len(m.Data); i += 4 {
			fn([4]byte(m.Data[i : i+4]))
		}
	}
	return nil
}

// close stops the watch and returns its socket's error, if it failed.
func (w *kernelWatch) close() error {
	w.closed.Store(true)
	w.f.Close()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// missing counts the written changes not yet seen nor lost.
func (w *kernelWatch) missing(changes []change) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for i, c := range changes {
		_, seen := w.seen[i]
		if !c.failed && !seen && !w.lost[i] {
			n++
		}
	}
	return n
}

// kernelHolds reports which of ips the rules and elements of the kube-*
// tables in namespace ns hold now, read from the kernel's ruleset: the
// fallback for changes whose notification may have been dropped.
func kernelHolds(ns string, ips map[[4]byte]bool) (map[[4]byte]bool, error) {
	k, err := nftlib.OpenKernel("/run/netns/" + ns)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	held := map[[4]byte]bool{}
	_, err = k.Count(func(table string) bool { return strings.HasPrefix(table, "kube-") }, func(v []byte) {
		if len(v) >= 4 && ips[[4]byte(v[:4])] {
			held[[4]byte(v[:4])] = true
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading the ruleset of %s: %w", ns, err)
	}
	return held, nil
}
