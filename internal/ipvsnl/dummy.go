package ipvsnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// DummyName is the link that holds the virtual addresses.
const DummyName = "kube-ipvs0"

// Dummy is kube-ipvs0 over rtnetlink: a dummy link, never set up, whose
// addresses make the virtual addresses local. Address changes go in
// batches (many RTM_NEWADDR or RTM_DELADDR in one write, the last one
// acked): a call per address costs a round trip each. This kernel has no
// dummy links; only the VM tests run it, the encoding is unit tested.
type Dummy struct {
	fd    int
	index int32
	seq   uint32
	buf   []byte
}

// OpenDummy opens an rtnetlink socket in the current network namespace, or
// the one at netnsPath, and creates kube-ipvs0 there if it is missing.
func OpenDummy(netnsPath string) (*Dummy, error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	d := &Dummy{fd: fd, buf: make([]byte, 1<<16)}
	err = d.exchange(newLinkMessage(DummyName, d.nextSeq()), nil)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		d.Close()
		return nil, fmt.Errorf("creating %s: %w", DummyName, err)
	}
	if err := d.findIndex(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// findIndex reads kube-ipvs0's interface index; the error wraps ENODEV
// when there is no such link.
func (d *Dummy) findIndex() error {
	err := d.exchange(getLinkMessage(DummyName, d.nextSeq()), func(typ uint16, p []byte) {
		if typ == unix.RTM_NEWLINK && len(p) >= unix.SizeofIfInfomsg {
			d.index = int32(binary.NativeEndian.Uint32(p[4:8]))
		}
	})
	switch {
	case err != nil:
		return fmt.Errorf("finding %s: %w", DummyName, err)
	case d.index == 0:
		return fmt.Errorf("finding %s: the kernel's answer has no interface index", DummyName)
	}
	return nil
}

// Close closes the socket.
func (d *Dummy) Close() error { return unix.Close(d.fd) }

func (d *Dummy) nextSeq() uint32 { d.seq++; return d.seq }

// Addrs dumps the link's addresses.
func (d *Dummy) Addrs() ([]netip.Addr, error) {
	var out []netip.Addr
	req := nlMessage(unix.RTM_GETADDR, unix.NLM_F_DUMP, d.nextSeq(), make([]byte, unix.SizeofIfAddrmsg))
	err := d.exchange(req, func(typ uint16, p []byte) {
		if typ != unix.RTM_NEWADDR || len(p) < unix.SizeofIfAddrmsg || int32(binary.NativeEndian.Uint32(p[4:8])) != d.index {
			return
		}
		for a := p[unix.SizeofIfAddrmsg:]; len(a) >= 4; {
			l := int(binary.NativeEndian.Uint16(a))
			if l < 4 || l > len(a) {
				break
			}
			if binary.NativeEndian.Uint16(a[2:]) == unix.IFA_ADDRESS {
				if ip, ok := netip.AddrFromSlice(a[4:l]); ok {
					out = append(out, ip)
				}
			}
			a = a[min((l+3)&^3, len(a)):]
		}
	})
	return out, err
}

// AddAddrs adds full-length addresses in one write.
func (d *Dummy) AddAddrs(addrs []netip.Addr) error { return d.addrs(unix.RTM_NEWADDR, addrs) }

// DelAddrs deletes addresses in one write.
func (d *Dummy) DelAddrs(addrs []netip.Addr) error { return d.addrs(unix.RTM_DELADDR, addrs) }

// addrsPerWrite bounds one write of address messages: a write must fit the
// socket's send buffer (10k addresses did not: EMSGSIZE), and its acks,
// one per message, the receive buffer.
const addrsPerWrite = 512

func (d *Dummy) addrs(typ uint16, addrs []netip.Addr) error {
	var errs []error
	for len(addrs) > 0 {
		n := min(len(addrs), addrsPerWrite)
		if err := d.addrsWrite(typ, addrs[:n]); err != nil {
			if !isPerAddress(err) {
				return err
			}
			errs = append(errs, err)
		}
		addrs = addrs[n:]
	}
	return errors.Join(errs...)
}

// perAddressError holds the errors of single addresses in one write (the
// others in it were applied).
type perAddressError struct{ error }

func isPerAddress(err error) bool {
	var pe perAddressError
	return errors.As(err, &pe)
}

func (d *Dummy) addrsWrite(typ uint16, addrs []netip.Addr) error {
	msgs, last := addrMessages(typ, d.index, addrs, d.seq+1)
	d.seq = last
	var errs []error
	if err := d.send(msgs); err != nil {
		return err
	}
	first := last - uint32(len(addrs)) + 1
	for done := false; !done; {
		err := d.receive(func(t uint16, seq uint32, p []byte) {
			if t != unix.NLMSG_ERROR {
				return
			}
			if e := nlmsg.Errno(p); e != 0 && seq-first < uint32(len(addrs)) {
				errs = append(errs, fmt.Errorf("%s: %w", addrs[seq-first], e))
			}
			done = done || seq == last
		})
		if err != nil {
			return err
		}
	}
	if len(errs) > 0 {
		return perAddressError{errors.Join(errs...)}
	}
	return nil
}

// exchange sends one request and calls fn with each answer until the
// dump is done or the request acked.
func (d *Dummy) exchange(req []byte, fn func(typ uint16, payload []byte)) error {
	seq := d.seq
	if err := d.send(req); err != nil {
		return err
	}
	return nlmsg.ReceiveAnswers(d.fd, d.buf, seq, fn)
}

func (d *Dummy) send(b []byte) error { return nlmsg.Send(d.fd, b) }

func (d *Dummy) receive(fn func(typ uint16, seq uint32, payload []byte)) error {
	return nlmsg.Receive(d.fd, d.buf, fn)
}

// DummyAddrs returns kube-ipvs0's addresses in the current network
// namespace or the one at netnsPath, without creating the link; exists is
// false when there is no kube-ipvs0.
func DummyAddrs(netnsPath string) (addrs []netip.Addr, exists bool, err error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, false, err
	}
	d := &Dummy{fd: fd, buf: make([]byte, 1<<16)}
	defer d.Close()
	err = d.findIndex()
	if errors.Is(err, unix.ENODEV) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	addrs, err = d.Addrs()
	if err != nil {
		return nil, true, fmt.Errorf("listing the addresses of %s: %w", DummyName, err)
	}
	return addrs, true, nil
}

// DeleteDummy deletes kube-ipvs0 (and with it its addresses) in the
// current network namespace or the one at netnsPath; removed is false when
// there was no such link (a kernel without dummy links has none).
func DeleteDummy(netnsPath string) (removed bool, err error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_ROUTE)
	if err != nil {
		return false, err
	}
	d := &Dummy{fd: fd, buf: make([]byte, 1<<16)}
	defer d.Close()
	err = d.exchange(delLinkMessage(DummyName, d.nextSeq()), nil)
	if errors.Is(err, unix.ENODEV) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("deleting %s: %w", DummyName, err)
	}
	return true, nil
}

// DeleteDummyAndServers deletes the virtual servers on kube-ipvs0's
// addresses (through k; nil for a kernel without IPVS), then kube-ipvs0
// itself: what upstream kube-proxy's IPVS mode leaves behind when another
// mode takes over (package leftover). Virtual servers on other addresses
// (NodePorts on the node's, or someone else's) stay. IPVS mode never calls
// it: there these are its own.
func DeleteDummyAndServers(netnsPath string, k Kernel) (servers int, link bool, err error) {
	addrs, exists, err := DummyAddrs(netnsPath)
	if err != nil || !exists {
		return 0, false, err
	}
	if k != nil && len(addrs) > 0 {
		on := map[netip.Addr]bool{}
		for _, a := range addrs {
			on[a] = true
		}
		servers, err = DeleteMatching(k, "on "+DummyName, func(v VirtualServer) bool { return on[v.Addr] })
		if err != nil {
			return servers, false, err
		}
	}
	link, err = DeleteDummy(netnsPath)
	return servers, link, err
}

// nlMessage is one netlink message: header, then body.
func nlMessage(typ, flags uint16, seq uint32, body []byte) []byte {
	out := make([]byte, nlHdrLen, nlHdrLen+len(body))
	binary.NativeEndian.PutUint32(out[0:], uint32(nlHdrLen+len(body)))
	binary.NativeEndian.PutUint16(out[4:], typ)
	binary.NativeEndian.PutUint16(out[6:], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(out[8:], seq)
	return append(out, body...)
}

func rtattr(typ uint16, data []byte) []byte {
	out := binary.NativeEndian.AppendUint16(nil, uint16(4+len(data)))
	out = binary.NativeEndian.AppendUint16(out, typ)
	out = append(out, data...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return out
}

// addrMessages encodes one RTM_NEWADDR (add: create, exclusive) or
// RTM_DELADDR per address, with sequence numbers from seq on; only the last
// asks for an ack (the kernel answers a failed one anyway). It returns the
// messages and the last sequence number.
func addrMessages(typ uint16, index int32, addrs []netip.Addr, seq uint32) ([]byte, uint32) {
	var out []byte
	for i, a := range addrs {
		family, flags := uint8(unix.AF_INET), uint16(0)
		if a.Is6() {
			family = unix.AF_INET6
		}
		if typ == unix.RTM_NEWADDR {
			flags = unix.NLM_F_CREATE | unix.NLM_F_EXCL
		}
		if i == len(addrs)-1 {
			flags |= unix.NLM_F_ACK
		}
		body := make([]byte, unix.SizeofIfAddrmsg)
		body[0] = family
		body[1] = uint8(a.BitLen())
		if a.Is6() {
			body[2] = unix.IFA_F_NODAD
		}
		body[3] = unix.RT_SCOPE_UNIVERSE
		binary.NativeEndian.PutUint32(body[4:], uint32(index))
		body = append(body, rtattr(unix.IFA_LOCAL, a.AsSlice())...)
		body = append(body, rtattr(unix.IFA_ADDRESS, a.AsSlice())...)
		out = append(out, nlMessage(typ, flags, seq+uint32(i), body)...)
	}
	return out, seq + uint32(len(addrs)) - 1
}

// newLinkMessage creates a dummy link (left down).
func newLinkMessage(name string, seq uint32) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, rtattr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	body = append(body, rtattr(unix.IFLA_LINKINFO|unix.NLA_F_NESTED, rtattr(unix.IFLA_INFO_KIND, []byte("dummy")))...)
	return nlMessage(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, seq, body)
}

func getLinkMessage(name string, seq uint32) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, rtattr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	return nlMessage(unix.RTM_GETLINK, unix.NLM_F_ACK, seq, body)
}

func delLinkMessage(name string, seq uint32) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, rtattr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	return nlMessage(unix.RTM_DELLINK, unix.NLM_F_ACK, seq, body)
}
