package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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
	// the given L4 protocol (CTA_FILTER_F_CTA_PROTO_NUM, Linux 5.8+).
	filterProtoNum = 1 << 3
)

// Conn is a ctnetlink socket in one network namespace.
type Conn struct {
	nl *netlink.Conn
	// noFilter is set once the kernel refused a filtered dump: later dumps
	// read everything and filter here.
	noFilter bool
	// lastRead counts the entries the last dump carried, before the
	// protocol check here (tests check the kernel filtered).
	lastRead int
}

// Dial opens a ctnetlink socket in the current network namespace, or in
// the one netns (an open /var/run/netns file) names when it is not 0.
func Dial(netns int) (*Conn, error) {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("opening a ctnetlink socket: %w", err)
	}
	// A dump of a large table arrives faster than one read at a time.
	_ = nl.SetReadBuffer(4 << 20)
	return &Conn{nl: nl}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.nl.Close() }

func nfgenHeader(family uint8) []byte { return []byte{family, 0 /* NFNETLINK_V0 */, 0, 0} }

func msgType(msg int) netlink.HeaderType { return netlink.HeaderType(subsysCtnetlink<<8 | msg) }

// List reads the conntrack entries of one family (unix.AF_INET or AF_INET6)
// and L4 protocol, asking the kernel to filter when it can.
func (c *Conn) List(family, proto uint8) ([]Flow, error) {
	if !c.noFilter {
		flows, err := c.dump(family, proto, true)
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
			return flows, err
		}
		c.noFilter = true // an older kernel: filter here
	}
	return c.dump(family, proto, false)
}

func (c *Conn) dump(family, proto uint8, filtered bool) ([]Flow, error) {
	data := nfgenHeader(family)
	if filtered {
		ae := netlink.NewAttributeEncoder()
		ae.Nested(ctaTupleOrig, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
				ae.Uint8(ctaProtoNum, proto)
				return nil
			})
			return nil
		})
		ae.Nested(ctaFilter, func(ae *netlink.AttributeEncoder) error {
			// The kernel reads the filter flags in host byte order.
			ae.Uint32(ctaFilterOrigFlags, filterProtoNum)
			ae.Uint32(ctaFilterReplyFlags, 0)
			return nil
		})
		attrs, err := ae.Encode()
		if err != nil {
			return nil, fmt.Errorf("encoding a conntrack dump filter: %w", err)
		}
		data = append(data, attrs...)
	}
	req := netlink.Message{
		Header: netlink.Header{Type: msgType(msgCtGet), Flags: netlink.Request | netlink.Dump},
		Data:   data,
	}
	if _, err := c.nl.Send(req); err != nil {
		return nil, fmt.Errorf("asking for the conntrack table: %w", err)
	}
	var flows []Flow
	c.lastRead = 0
	for m, err := range c.nl.ReceiveIter() {
		if err != nil {
			return nil, fmt.Errorf("reading the conntrack table: %w", err)
		}
		c.lastRead++
		f, err := parseFlow(m.Data)
		if err != nil {
			return nil, fmt.Errorf("reading the conntrack table: %w", err)
		}
		if f.Proto == proto {
			flows = append(flows, f)
		}
	}
	return flows, nil
}

// parseFlow decodes one IPCTNL_MSG_CT_NEW message of a dump.
func parseFlow(b []byte) (Flow, error) {
	var f Flow
	if len(b) < 4 {
		return f, errors.New("short conntrack message")
	}
	ad, err := netlink.NewAttributeDecoder(b[4:])
	if err != nil {
		return f, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				f.Proto, f.OrigSrc, f.OrigDst = parseTuple(nad)
				return nil
			})
		case ctaTupleReply:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				_, f.ReplySrc, _ = parseTuple(nad)
				return nil
			})
		case ctaID:
			f.ID = ad.Uint32()
		case ctaZone:
			f.Zone = ad.Uint16()
		}
	}
	return f, ad.Err()
}

func parseTuple(ad *netlink.AttributeDecoder) (proto uint8, src, dst netip.AddrPort) {
	ad.ByteOrder = binary.BigEndian
	var srcIP, dstIP netip.Addr
	var sport, dport uint16
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(ad *netlink.AttributeDecoder) error {
				for ad.Next() {
					a, _ := netip.AddrFromSlice(ad.Bytes())
					switch ad.Type() {
					case ctaIPv4Src, ctaIPv6Src:
						srcIP = a
					case ctaIPv4Dst, ctaIPv6Dst:
						dstIP = a
					}
				}
				return nil
			})
		case ctaTupleProto:
			ad.Nested(func(ad *netlink.AttributeDecoder) error {
				ad.ByteOrder = binary.BigEndian
				for ad.Next() {
					switch ad.Type() {
					case ctaProtoNum:
						proto = ad.Uint8()
					case ctaProtoSrcPort:
						sport = ad.Uint16()
					case ctaProtoDstPort:
						dport = ad.Uint16()
					}
				}
				return nil
			})
		}
	}
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
		msgs := make([]netlink.Message, 0, len(batch))
		for _, f := range batch {
			m, err := deleteMessage(f)
			if err != nil {
				return deleted, err
			}
			msgs = append(msgs, m)
		}
		if _, err := c.nl.SendMessages(msgs); err != nil {
			return deleted, fmt.Errorf("deleting conntrack entries: %w", err)
		}
		// One ack (or error) comes back per message.
		for range msgs {
			_, err := c.nl.Receive()
			switch {
			case err == nil:
				deleted++
			case errors.Is(err, unix.ENOENT):
				// expired or deleted meanwhile
			case firstErr == nil:
				firstErr = fmt.Errorf("deleting a conntrack entry: %w", err)
			}
		}
	}
	return deleted, firstErr
}

func deleteMessage(f Flow) (netlink.Message, error) {
	family := uint8(unix.AF_INET)
	srcType, dstType := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if f.OrigSrc.Addr().Is6() {
		family, srcType, dstType = unix.AF_INET6, ctaIPv6Src, ctaIPv6Dst
	}
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(ctaTupleOrig, func(ae *netlink.AttributeEncoder) error {
		ae.ByteOrder = binary.BigEndian
		ae.Nested(ctaTupleIP, func(ae *netlink.AttributeEncoder) error {
			ae.Bytes(srcType, f.OrigSrc.Addr().AsSlice())
			ae.Bytes(dstType, f.OrigDst.Addr().AsSlice())
			return nil
		})
		ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
			ae.ByteOrder = binary.BigEndian
			ae.Uint8(ctaProtoNum, f.Proto)
			ae.Uint16(ctaProtoSrcPort, f.OrigSrc.Port())
			ae.Uint16(ctaProtoDstPort, f.OrigDst.Port())
			return nil
		})
		return nil
	})
	if f.Zone != 0 {
		ae.Uint16(ctaZone, f.Zone)
	}
	ae.Uint32(ctaID, f.ID)
	attrs, err := ae.Encode()
	if err != nil {
		return netlink.Message{}, fmt.Errorf("encoding a conntrack delete: %w", err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: msgType(msgCtDelete), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenHeader(family), attrs...),
	}, nil
}
