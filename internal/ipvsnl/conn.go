package ipvsnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// Conn is a generic netlink socket speaking IPVS in one network namespace.
// It is the real Kernel; only the VM tests exercise it.
type Conn struct {
	fd     int
	family uint16 // the IPVS generic netlink family id
	seq    uint32
	netns  string
	buf    []byte
	writes int // sendmsg calls (Writes)
}

var _ Kernel = (*Conn)(nil)

// ErrNoIPVS is returned when the kernel has no IPVS (module not loaded).
var ErrNoIPVS = errors.New("the kernel has no IPVS (is the ip_vs module loaded?)")

// batchBytes bounds one write: the kernel refuses a write larger than the
// socket's send buffer, and each write's errors must fit the receive one.
const batchBytes = 256 << 10

// receiveTimeout bounds the wait for an answer of the kernel.
const receiveTimeout = 30 * time.Second

// Dial opens an IPVS socket in the current network namespace, or in the
// one at netnsPath, and resolves the IPVS family.
func Dial(netnsPath string) (*Conn, error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("opening a generic netlink socket: %w", err)
	}
	for opt, size := range map[int]int{unix.SO_SNDBUFFORCE: 4 << 20, unix.SO_RCVBUFFORCE: 4 << 20} {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, size) != nil {
			fallback := unix.SO_SNDBUF
			if opt == unix.SO_RCVBUFFORCE {
				fallback = unix.SO_RCVBUF
			}
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, fallback, size)
		}
	}
	// Errors need not echo each failed request back.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	// The kernel handles a write while it is sent and produces a dump
	// while it is read: an answer that has not come in this long never
	// will, and an error beats a process stuck in recvfrom.
	tv := unix.NsecToTimeval(receiveTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("setting the netlink receive timeout: %w", err)
	}
	c := &Conn{fd: fd, netns: netnsPath, buf: make([]byte, 1<<16)}
	c.seq = 1
	if _, err := c.roundTrip(appendFamilyRequest(nil, c.seq, ipvsFamilyName), func(payload []byte) error {
		id, err := parseFamilyID(payload)
		c.family = id
		return err
	}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ENOENT) {
			return nil, ErrNoIPVS
		}
		return nil, fmt.Errorf("resolving the IPVS generic netlink family: %w", err)
	}
	return c, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// Writes is the number of sendmsg calls so far (Apply batches its ops into
// as few as it can): tests count a sync's cost in them.
func (c *Conn) Writes() int { return c.writes }

func (c *Conn) send(b []byte) error {
	c.writes++
	return nlmsg.Send(c.fd, b)
}

// receive reads one datagram and calls fn for each message in it.
func (c *Conn) receive(fn func(typ uint16, seq uint32, payload []byte)) error {
	err := nlmsg.Receive(c.fd, c.buf, fn)
	if errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("no answer from the kernel in %v", receiveTimeout)
	}
	return err
}

// roundTrip sends one request (a dump or a single message with seq c.seq)
// and calls fn for each answer until the dump ends or the ack comes.
func (c *Conn) roundTrip(req []byte, fn func(payload []byte) error) (int, error) {
	seq := c.seq
	if err := c.send(req); err != nil {
		return 0, err
	}
	n := 0
	var failed error
	for done := false; !done; {
		err := c.receive(func(typ uint16, s uint32, payload []byte) {
			switch {
			case s != seq || done:
			case typ == unix.NLMSG_DONE || typ == unix.NLMSG_ERROR:
				done = true
				if e := nlmsg.Errno(payload); e != 0 && failed == nil {
					failed = e
				}
			case failed == nil:
				n++
				failed = fn(payload)
			}
		})
		if err != nil {
			return n, err
		}
	}
	return n, failed
}

func (c *Conn) nextSeq() uint32 { c.seq++; return c.seq }

// Read dumps the services, then takes every real server from one read of
// /proc/net/ip_vs instead of a dump per service (a dump each only for the
// services that file leaves out).
func (c *Conn) Read() ([]VirtualServer, error) {
	var vss []VirtualServer
	if _, err := c.roundTrip(appendDump(nil, c.family, c.nextSeq(), nil), func(p []byte) error {
		if s, ok := parseService(p); ok {
			vss = append(vss, VirtualServer{Service: s})
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("listing IPVS services: %w", err)
	}
	var dests map[ServiceKey][]Dest
	err := netns.Do(c.netns, func() error {
		f, err := os.Open("/proc/thread-self/net/ip_vs")
		if err != nil {
			return err
		}
		defer f.Close()
		dests, err = parseProcIPVS(f)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading IPVS real servers: %w", err)
	}
	// /proc/net/ip_vs can leave services out when other network
	// namespaces have IPVS services (seen on Debian's 6.1: its seq_next
	// counts every namespace's services into the file position, its
	// seq_start only this namespace's, so each read() after the first
	// skips some). A service and its real servers are one record: a
	// service it lists is complete. The others get a dump each.
	kept := vss[:0]
	for _, v := range vss {
		ds, listed := dests[v.ServiceKey]
		if !listed {
			var err error
			ds, err = c.Dests(v.ServiceKey)
			if errors.Is(err, unix.ESRCH) {
				continue // deleted since the dump
			}
			if err != nil {
				return nil, err
			}
		}
		// In the order FakeKernel gives: by key, real servers by address.
		v.Dests = ds
		slices.SortFunc(v.Dests, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
		kept = append(kept, v)
	}
	vss = kept
	slices.SortFunc(vss, func(a, b VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	return vss, nil
}

// Dests dumps one service's real servers, ordered by address. The kernel
// answers a dump for a missing service with nothing, like one for a
// service without real servers; an empty answer is followed by a
// GET_SERVICE, which says ESRCH when the service is missing.
func (c *Conn) Dests(k ServiceKey) ([]Dest, error) {
	svc := Service{ServiceKey: k}
	var out []Dest
	if _, err := c.roundTrip(appendDump(nil, c.family, c.nextSeq(), &svc), func(p []byte) error {
		if d, ok := parseDest(p, family(k.Addr)); ok {
			out = append(out, d)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("listing the real servers of %s: %w", k, err)
	}
	if len(out) == 0 {
		var a attrs
		serviceAttrs(&a, svc, false)
		req := appendMessage(nil, c.family, unix.NLM_F_ACK, c.nextSeq(), uint8(cmdGetService), ipvsGenlVersion, a)
		if _, err := c.roundTrip(req, func([]byte) error { return nil }); err != nil {
			return nil, fmt.Errorf("looking up %s: %w", k, err)
		}
	}
	slices.SortFunc(out, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// Apply writes ops in batches of at most batchBytes. Only the last message
// of a batch asks for an ack: the kernel handles a write's messages in
// order and answers a failed one with its error anyway, so the last ack
// means the whole batch was handled.
func (c *Conn) Apply(ops []Op) ([]error, error) {
	var errs []error
	for start := 0; start < len(ops); {
		first := c.seq + 1
		var req []byte
		end, lastOff := start, 0
		for ; end < len(ops) && (end == start || len(req) < batchBytes); end++ {
			lastOff = len(req)
			req = appendOp(req, c.family, 0, c.nextSeq(), ops[end])
		}
		// Only the batch's last message asks for an ack (nlmsg_flags is at
		// offset 6 of its header).
		binary.NativeEndian.PutUint16(req[lastOff+6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
		if err := c.send(req); err != nil {
			return nil, fmt.Errorf("sending IPVS commands: %w", err)
		}
		last := c.seq
		for done := false; !done; {
			err := c.receive(func(typ uint16, s uint32, payload []byte) {
				if typ != unix.NLMSG_ERROR || s-first > last-first { // (wraps safely)
					return
				}
				if e := nlmsg.Errno(payload); e != 0 {
					if errs == nil {
						errs = make([]error, len(ops))
					}
					errs[start+int(s-first)] = e
				}
				done = done || s == last
			})
			if err != nil {
				return nil, fmt.Errorf("reading IPVS acks: %w", err)
			}
		}
		start = end
	}
	return errs, nil
}
