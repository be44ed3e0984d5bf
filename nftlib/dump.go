package nftlib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
	"golang.org/x/sys/unix"
)

// Netlink attribute and flag numbers of nf_tables that golang.org/x/sys/unix
// does not define (include/uapi/linux/netfilter/nf_tables.h).
const (
	nftaTableOwner   = 7
	nftaChainFlags   = 10
	nftTableFDormant = 1
	NftTableFOwner   = 2
	nftChainBase     = 1
	// NFT_CHAIN_BINDING: an anonymous chain, bound to the rule that jumps to it.
	NftChainBinding = 4
	// NFTA_FLOWTABLE_TABLE and NFTA_FLOWTABLE_NAME.
	nftaFlowtableTable = 1
	nftaFlowtableName  = 2
)

// nlAttr is one netlink attribute of a message being read.
type nlAttr struct {
	typ  uint16 // without the nested and byte-order flags
	data []byte
}

// forAttrs calls fn for each attribute in b, in order, and reports whether
// b was well formed (nlmsg.Walk).
func forAttrs(b []byte, fn func(a nlAttr)) bool {
	return nlmsg.Walk(b, func(typ uint16, data []byte) { fn(nlAttr{typ: typ, data: data}) })
}

func (a nlAttr) u32() uint32 {
	if len(a.data) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.data)
}

// str is a NUL-terminated string attribute.
func (a nlAttr) str() string {
	s := a.data
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return string(s)
}

// request encodes one nf_tables request message.
func (k *Kernel) request(typ, flags uint16, f Family, attrs func(m *batch)) ([]byte, uint32) {
	seq := k.seq
	m := &batch{seq: seq}
	m.begin(typ, flags, f)
	// begin leaves the batch markers' numbers alone, which GETGEN shares.
	binary.NativeEndian.PutUint16(m.Buf[4:], typ|unix.NFNL_SUBSYS_NFTABLES<<8)
	if attrs != nil {
		attrs(m)
	}
	m.end()
	k.seq++
	return m.Buf, seq
}

// dump sends a dump request and calls fn with the attributes (after the
// nfgenmsg) of each object the kernel returns. fn must copy what it keeps:
// the buffer is reused.
func (k *Kernel) dump(typ uint16, f Family, attrs func(m *batch), fn func(payload []byte) error) error {
	return k.dumpFamilies(typ, f, attrs, func(_ Family, p []byte) error { return fn(p) })
}

// dumpFamilies is dump with each object's family (from its nfgenmsg), for
// dumps of every family (NFPROTO_UNSPEC).
func (k *Kernel) dumpFamilies(typ uint16, f Family, attrs func(m *batch), fn func(f Family, payload []byte) error) error {
	req, seq := k.request(typ, unix.NLM_F_DUMP, f, attrs)
	if err := unix.Sendto(k.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending dump request: %w", err)
	}
	// A dump comes in skbs of at most 32 KiB each.
	if k.dumpBuf == nil {
		k.dumpBuf = make([]byte, 64<<10)
	}
	buf := k.dumpBuf
	var fnErr error
	for {
		n, _, err := unix.Recvfrom(k.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("reading dump: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("parsing dump: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // a late answer to something else
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return fnErr
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return syscall.Errno(errno)
					}
				}
				return fnErr
			}
			if fnErr == nil && len(m.Data) >= NfgenLen {
				fnErr = fn(Family(m.Data[0]), m.Data[NfgenLen:])
			}
		}
	}
}

// Generation returns the network namespace's nftables ruleset generation:
// every committed transaction, ours or anyone's, moves it by one.
func (k *Kernel) Generation() (uint32, error) {
	req, seq := k.request(unix.NFT_MSG_GETGEN, 0, unix.NFPROTO_UNSPEC, nil)
	if err := unix.Sendto(k.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("asking for the nftables generation: %w", err)
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(k.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, fmt.Errorf("reading the nftables generation: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, fmt.Errorf("parsing the nftables generation: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			if m.Header.Type == unix.NLMSG_ERROR {
				if len(m.Data) >= 4 {
					return 0, fmt.Errorf("nftables generation: %w", syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data))))
				}
				return 0, errors.New("nftables generation: short error")
			}
			if len(m.Data) < NfgenLen {
				continue
			}
			var gen uint32
			var found bool
			forAttrs(m.Data[NfgenLen:], func(a nlAttr) {
				if a.typ == unix.NFTA_GEN_ID {
					gen, found = a.u32(), true
				}
			})
			if !found {
				return 0, errors.New("nftables generation: no NFTA_GEN_ID in the answer")
			}
			return gen, nil
		}
	}
}

// PortID is the netlink port id the kernel gave our socket, which an
// owner-flagged table of ours would carry.
func (k *Kernel) PortID() uint32 {
	sa, err := unix.Getsockname(k.fd)
	if nl, ok := sa.(*unix.SockaddrNetlink); err == nil && ok {
		return nl.Pid
	}
	return 0
}
