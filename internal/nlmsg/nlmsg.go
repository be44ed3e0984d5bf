// Package nlmsg builds and splits raw netlink messages and attributes, for
// the project's own netlink clients (ctnetlink, IPVS generic netlink,
// rtnetlink), which batch many requests per write and parse dumps in place.
package nlmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// HdrLen is the length of a netlink message header.
	HdrLen = unix.SizeofNlMsghdr
	// Nested is the flag of an attribute holding attributes (NLA_F_NESTED).
	Nested = 1 << 15
	// typeMask keeps an attribute's type bits (NLA_TYPE_MASK).
	typeMask = 0x3fff
)

// Attrs builds netlink attributes, each padded to 4 bytes.
type Attrs []byte

// Put appends one attribute.
func (a *Attrs) Put(typ uint16, data ...byte) {
	l := 4 + len(data)
	*a = binary.NativeEndian.AppendUint16(*a, uint16(l))
	*a = binary.NativeEndian.AppendUint16(*a, typ)
	*a = append(*a, data...)
	for ; l%4 != 0; l++ {
		*a = append(*a, 0)
	}
}

// U16 appends a uint16 attribute in host order.
func (a *Attrs) U16(typ, v uint16) { a.Put(typ, binary.NativeEndian.AppendUint16(nil, v)...) }

// U32 appends a uint32 attribute in host order.
func (a *Attrs) U32(typ uint16, v uint32) { a.Put(typ, binary.NativeEndian.AppendUint32(nil, v)...) }

// BE16 appends a uint16 attribute in network order.
func (a *Attrs) BE16(typ, v uint16) { a.Put(typ, binary.BigEndian.AppendUint16(nil, v)...) }

// Nest appends a nested attribute whose contents fill writes.
func (a *Attrs) Nest(typ uint16, fill func(*Attrs)) {
	start := len(*a)
	a.Put(typ | Nested)
	fill(a)
	binary.NativeEndian.PutUint16((*a)[start:], uint16(len(*a)-start))
}

// Walk calls fn for each attribute in b, with its type (flags cleared) and
// payload; it stops at a malformed one, and reports whether b was well
// formed.
func Walk(b []byte, fn func(typ uint16, data []byte)) bool {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			return false
		}
		fn(binary.NativeEndian.Uint16(b[2:])&typeMask, b[4:l])
		b = b[min((l+3)&^3, len(b)):]
	}
	return len(b) == 0
}

// EachMessage splits a datagram into netlink messages and calls fn with
// each one's type, sequence number and payload.
func EachMessage(b []byte, fn func(typ uint16, seq uint32, payload []byte)) error {
	for len(b) >= HdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < HdrLen || l > len(b) {
			return fmt.Errorf("malformed netlink message of %d bytes", l)
		}
		fn(binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint32(b[8:]), b[HdrLen:l])
		b = b[min((l+3)&^3, len(b)):]
	}
	return nil
}

// Errno reads the error code of an NLMSG_ERROR or NLMSG_DONE payload.
func Errno(payload []byte) syscall.Errno {
	if len(payload) < 4 {
		return 0
	}
	return syscall.Errno(-int32(binary.NativeEndian.Uint32(payload)))
}

// Send writes one datagram to the kernel on netlink socket fd, retrying
// when interrupted.
func Send(fd int, b []byte) error {
	for {
		err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Receive reads one datagram from netlink socket fd into buf and calls fn
// for each message in it. A datagram larger than buf is an error rather
// than a message cut short.
func Receive(fd int, buf []byte, fn func(typ uint16, seq uint32, payload []byte)) error {
	for {
		// MSG_TRUNC: n is the datagram's length even when buf is shorter.
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n > len(buf):
			return fmt.Errorf("a netlink datagram of %d bytes, larger than the %d-byte buffer", n, len(buf))
		}
		return EachMessage(buf[:n], fn)
	}
}

// ReceiveAnswers reads the answers to the request with sequence number seq
// until the dump ends (NLMSG_DONE) or the ack or error comes
// (NLMSG_ERROR), and calls fn, when set, with every other message of seq;
// messages of other requests are skipped. It returns the error of Receive,
// or else the kernel's error code from the last message.
func ReceiveAnswers(fd int, buf []byte, seq uint32, fn func(typ uint16, payload []byte)) error {
	var failed error
	for done := false; !done; {
		err := Receive(fd, buf, func(typ uint16, s uint32, p []byte) {
			switch {
			case s != seq || done:
			case typ == unix.NLMSG_DONE || typ == unix.NLMSG_ERROR:
				done = true
				if e := Errno(p); e != 0 {
					failed = e
				}
			case fn != nil:
				fn(typ, p)
			}
		})
		if err != nil {
			return err
		}
	}
	return failed
}
