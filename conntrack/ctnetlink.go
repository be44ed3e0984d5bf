package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// ctnetlink message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	subsysCtnetlink = 1 // NFNL_SUBSYS_CTNETLINK
	msgCtGet        = 1 // IPCTNL_MSG_CT_GET
	msgCtDelete     = 2 // IPCTNL_MSG_CT_DELETE

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaID         = 12
	ctaZone       = 18
	ctaFilter     = 25

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2
	// filterProtoNum asks a dump for the entries whose original tuple has
	// the given L4 protocol (CTA_FILTER_F_CTA_PROTO_NUM, Linux 5.8+; the
	// kernel wants a family with it, not AF_UNSPEC).
	filterProtoNum = 1 << 3

	nlHdrLen = nlmsg.HdrLen
)

// Conn is a ctnetlink socket in one network namespace. We read and write
// the messages ourselves: a dump of 10^4 entries is parsed in place, with
// no allocation per attribute.
type Conn struct {
	fd  int
	seq uint32
	buf []byte // receive buffer: one dump skb (at most 32 KiB) or many acks
	// noFilter is set once the kernel refused a filtered dump: later dumps
	// read everything and filter here.
	noFilter bool
	// lastRead counts the entries the last dump carried, before the
	// protocol check here (tests check the kernel filtered).
	lastRead int
}

// Dial opens a ctnetlink socket in the current network namespace, or in
// the one at netnsPath (e.g. /run/netns/NAME) when it is not empty.
func Dial(netnsPath string) (*Conn, error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a ctnetlink socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// Acks of refused deletes need not echo the whole request.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return &Conn{fd: fd, buf: make([]byte, 1<<16)}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// attrs builds netlink attributes.
type attrs = nlmsg.Attrs

// message appends one ctnetlink request to buf.
func (c *Conn) message(buf []byte, msg int, flags uint16, family uint8, a attrs) []byte {
	c.seq++
	buf = binary.NativeEndian.AppendUint32(buf, uint32(nlHdrLen+4+len(a)))
	buf = binary.NativeEndian.AppendUint16(buf, subsysCtnetlink<<8|uint16(msg))
	buf = binary.NativeEndian.AppendUint16(buf, unix.NLM_F_REQUEST|flags)
	buf = binary.NativeEndian.AppendUint32(buf, c.seq)
	buf = binary.NativeEndian.AppendUint32(buf, 0)
	buf = append(buf, family, 0 /* NFNETLINK_V0 */, 0, 0)
	return append(buf, a...)
}

func (c *Conn) send(b []byte) error { return nlmsg.Send(c.fd, b) }

// receive reads one datagram and calls fn for each netlink message in it,
// with its type, sequence number and payload.
func (c *Conn) receive(fn func(typ uint16, seq uint32, data []byte)) error {
	return nlmsg.Receive(c.fd, c.buf, fn)
}

// List reads the conntrack entries of one family (unix.AF_INET, AF_INET6,
// or AF_UNSPEC for both) and L4 protocol, asking the kernel to filter when
// it can.
func (c *Conn) List(family, proto uint8) ([]Flow, error) {
	if !c.noFilter && family != unix.AF_UNSPEC {
		flows, err := c.dump(family, proto, true)
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
			return flows, err
		}
		c.noFilter = true // an older kernel: filter here
	}
	return c.dump(family, proto, false)
}

func (c *Conn) dump(family, proto uint8, filtered bool) ([]Flow, error) {
	var a attrs
	if filtered {
		a.Nest(ctaTupleOrig, func(a *attrs) {
			a.Nest(ctaTupleProto, func(a *attrs) { a.Put(ctaProtoNum, proto) })
		})
		a.Nest(ctaFilter, func(a *attrs) {
			// The kernel reads the filter flags in host byte order.
			a.Put(ctaFilterOrigFlags, binary.NativeEndian.AppendUint32(nil, filterProtoNum)...)
			a.Put(ctaFilterReplyFlags, 0, 0, 0, 0)
		})
	}
	req := c.message(nil, msgCtGet, unix.NLM_F_DUMP, family, a)
	seq := c.seq
	if err := c.send(req); err != nil {
		return nil, fmt.Errorf("asking for the conntrack table: %w", err)
	}
	var flows []Flow
	c.lastRead = 0
	for done := false; !done; {
		var failed error
		err := c.receive(func(typ uint16, s uint32, data []byte) {
			switch {
			case s != seq || done || failed != nil:
			case typ == unix.NLMSG_DONE:
				done = true
				if e := nlmsg.Errno(data); e != 0 {
					failed = e
				}
			case typ == unix.NLMSG_ERROR:
				if e := nlmsg.Errno(data); e != 0 {
					failed = e
				}
				done = true
			default:
				c.lastRead++
				if len(data) < 4 {
					return
				}
				if f := parseFlow(data[4:]); f.Proto == proto {
					flows = append(flows, f)
				}
			}
		})
		if err == nil {
			err = failed
		}
		if err != nil {
			if !done {
				c.drain(seq)
			}
			return nil, fmt.Errorf("reading the conntrack table: %w", err)
		}
	}
	return flows, nil
}

// drain reads what is left of an aborted dump, so the next request's
// answers do not mix with it.
func (c *Conn) drain(seq uint32) {
	for done := false; !done; {
		err := c.receive(func(typ uint16, s uint32, _ []byte) {
			if s == seq && (typ == unix.NLMSG_DONE || typ == unix.NLMSG_ERROR) {
				done = true
			}
		})
		if err != nil {
			return
		}
	}
}

// parseFlow decodes the attributes of one conntrack entry of a dump.
func parseFlow(b []byte) Flow {
	var f Flow
	nlmsg.Walk(b, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleOrig:
			f.Proto, f.OrigSrc, f.OrigDst = parseTuple(data)
		case ctaTupleReply:
			_, f.ReplySrc, _ = parseTuple(data)
		case ctaID:
			if len(data) >= 4 {
				f.ID = binary.BigEndian.Uint32(data)
			}
		case ctaZone:
			if len(data) >= 2 {
				f.Zone = binary.BigEndian.Uint16(data)
			}
		}
	})
	return f
}

func parseTuple(b []byte) (proto uint8, src, dst netip.AddrPort) {
	var srcIP, dstIP netip.Addr
	var sport, dport uint16
	nlmsg.Walk(b, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleIP:
			nlmsg.Walk(data, func(typ uint16, data []byte) {
				a, _ := netip.AddrFromSlice(data)
				switch typ {
				case ctaIPv4Src, ctaIPv6Src:
					srcIP = a
				case ctaIPv4Dst, ctaIPv6Dst:
					dstIP = a
				}
			})
		case ctaTupleProto:
			nlmsg.Walk(data, func(typ uint16, data []byte) {
				switch {
				case typ == ctaProtoNum && len(data) >= 1:
					proto = data[0]
				case typ == ctaProtoSrcPort && len(data) >= 2:
					sport = binary.BigEndian.Uint16(data)
				case typ == ctaProtoDstPort && len(data) >= 2:
					dport = binary.BigEndian.Uint16(data)
				}
			})
		}
	})
	return proto, netip.AddrPortFrom(srcIP, sport), netip.AddrPortFrom(dstIP, dport)
}

// deleteBatch is how many deletes go to the kernel in one write.
const deleteBatch = 256

// Delete removes the given entries, each by its original tuple, zone and
// id, so an entry created since the listing is never hit. Entries already
// gone are not errors. It returns how many it deleted.
func (c *Conn) Delete(flows []Flow) (int, error) {
	deleted := 0
	var firstErr error
	for start := 0; start < len(flows); start += deleteBatch {
		batch := flows[start:min(start+deleteBatch, len(flows))]
		var req []byte
		for _, f := range batch {
			req = c.message(req, msgCtDelete, unix.NLM_F_ACK, familyOf(f), deleteAttrs(f))
		}
		first := c.seq - uint32(len(batch)) + 1
		if err := c.send(req); err != nil {
			return deleted, fmt.Errorf("deleting conntrack entries: %w", err)
		}
		// The kernel handles the messages within the write and queues one
		// ack (or error) for each.
		for acks := 0; acks < len(batch); {
			err := c.receive(func(typ uint16, s uint32, data []byte) {
				if typ != unix.NLMSG_ERROR || s-first >= uint32(len(batch)) {
					return
				}
				acks++
				switch e := nlmsg.Errno(data); e {
				case 0:
					deleted++
				case unix.ENOENT: // expired or deleted meanwhile
				default:
					if firstErr == nil {
						firstErr = fmt.Errorf("deleting a conntrack entry: %w", e)
					}
				}
			})
			if err != nil {
				return deleted, fmt.Errorf("reading conntrack delete acks: %w", err)
			}
		}
	}
	return deleted, firstErr
}

func familyOf(f Flow) uint8 {
	if f.OrigSrc.Addr().Is6() {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func deleteAttrs(f Flow) attrs {
	srcType, dstType := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if f.OrigSrc.Addr().Is6() {
		srcType, dstType = ctaIPv6Src, ctaIPv6Dst
	}
	var a attrs
	a.Nest(ctaTupleOrig, func(a *attrs) {
		a.Nest(ctaTupleIP, func(a *attrs) {
			a.Put(srcType, f.OrigSrc.Addr().AsSlice()...)
			a.Put(dstType, f.OrigDst.Addr().AsSlice()...)
		})
		a.Nest(ctaTupleProto, func(a *attrs) {
			a.Put(ctaProtoNum, f.Proto)
			a.Put(ctaProtoSrcPort, binary.BigEndian.AppendUint16(nil, f.OrigSrc.Port())...)
			a.Put(ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, f.OrigDst.Port())...)
		})
	})
	if f.Zone != 0 {
		a.Put(ctaZone, binary.BigEndian.AppendUint16(nil, f.Zone)...)
	}
	a.Put(ctaID, binary.BigEndian.AppendUint32(nil, f.ID)...)
	return a
}
