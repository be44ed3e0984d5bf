package nftlib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// Kernel is our only door to the kernel's nftables: it sends transactions
// and reads back what a full sync needs to know. Everything else in this
// package works on values.
type Kernel struct {
	fd      int
	netns   string // "" for the current network namespace
	seq     uint32
	dumpBuf []byte
	// mon, when open, follows other processes' nftables commits (see
	// monitor); Close closes it.
	mon *monitor
}

// OpenKernel opens a netfilter netlink socket in the current network
// namespace, or in the one at netnsPath (e.g. /run/netns/NAME) when not empty.
func OpenKernel(netnsPath string) (*Kernel, error) {
	fd, err := socketIn(netnsPath)
	if err != nil {
		return nil, err
	}
	k := &Kernel{fd: fd, netns: netnsPath, seq: uint32(os.Getpid()) << 16}
	// A full sync of 10^5 objects is tens of MiB in one sendmsg: the send
	// buffer must hold it whole. The *FORCE options pass the sysctl caps
	// (we run with CAP_NET_ADMIN); fall back to the capped ones.
	const bufSize = 1 << 30
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufSize); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, bufSize)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	// Extended acks carry the kernel's own error text; capped acks do not
	// echo our (possibly huge) message back with an error.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return k, nil
}

// socketIn creates the socket inside another network namespace when asked:
// a socket stays in the namespace it was created in.
func socketIn(netnsPath string) (int, error) {
	return netns.NetlinkSocket(netnsPath, unix.NETLINK_NETFILTER)
}

// Close releases the socket, and the change monitor's if one was opened.
func (k *Kernel) Close() error {
	if k.mon != nil {
		k.mon.close()
		k.mon = nil
	}
	return unix.Close(k.fd)
}

// TxError is a transaction the kernel refused; nothing of it was applied.
type TxError struct {
	Op    string // what the refused message did
	Errno syscall.Errno
	Msg   string // the kernel's extended ack text, if any
	// Family and Table name the table the refused message changed
	// (Table is "" when it changed none, e.g. the batch's end).
	Family Family
	Table  string
}

func (e *TxError) Error() string {
	s := fmt.Sprintf("nftables transaction refused at %q: %v", e.Op, e.Errno)
	if e.Msg != "" {
		s += " (" + e.Msg + ")"
	}
	return s
}

func (e *TxError) Unwrap() error { return e.Errno }

// commit sends a batch as one transaction and waits for the kernel's verdict.
func (k *Kernel) commit(b *batch) error { return k.apply(b, nil) }

// apply is commit; echo, when not nil, gets a copy of every message the
// kernel sends back other than errors and acks (the notifications that
// NLM_F_ECHO asks for, which come before the final ack).
func (k *Kernel) apply(b *batch, echo func(msg syscall.NetlinkMessage)) error {
	defer b.release()
	if b.Messages() == 0 {
		// Nothing to change, and nothing to wait for: kernels before 6.10
		// never acknowledge a batch without messages.
		return nil
	}
	chunks, lastSeq, err := b.finish()
	if err != nil {
		return fmt.Errorf("encoding transaction: %w", err)
	}
	if err := k.fits(chunks); err != nil {
		return err
	}
	// One sendmsg: the kernel gathers the chunks into one batch.
	if _, err := unix.SendmsgBuffers(k.fd, chunks, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return fmt.Errorf("sending transaction of %d bytes: %w", b.Size(), err)
	}
	// The kernel handles the whole batch inside sendmsg and then queues its
	// answers: errors for refused messages and the ack of the last one.
	first, err := k.result(b, binary.NativeEndian.Uint32(chunks[0][8:]), lastSeq, echo)
	if errors.Is(err, unix.ENOBUFS) {
		// The queue overflowed: the verdict is lost, and what is left of
		// the answers must not be read as the next transaction's.
		k.drain()
		return fmt.Errorf("%w: %w", ErrAnswersLost, err)
	}
	if err != nil {
		return err
	}
	if first != nil {
		return first
	}
	return nil
}

// result reads a batch's answers until the ack of its last message
// (lastSeq) or, after an error, until nothing more is queued, and returns
// the first refusal. Answers to other requests than the batch's (firstSeq,
// its begin, to lastSeq+1, its end) are skipped.
func (k *Kernel) result(b *batch, firstSeq, lastSeq uint32, echo func(msg syscall.NetlinkMessage)) (*TxError, error) {
	var first *TxError
	rbuf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(k.fd, rbuf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return first, fmt.Errorf("reading transaction result: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(rbuf[:n])
		if err != nil {
			return first, fmt.Errorf("parsing transaction result: %w", err)
		}
		done := false
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR {
				if echo != nil {
					echo(syscall.NetlinkMessage{Header: m.Header, Data: clone(m.Data)})
				}
				continue
			}
			if len(m.Data) < 4+nlmsgHdrLen {
				continue
			}
			errno := -int32(binary.NativeEndian.Uint32(m.Data[0:4]))
			seq := binary.NativeEndian.Uint32(m.Data[4+8:])
			if seq-firstSeq > lastSeq+1-firstSeq {
				continue // an answer to something else (a lost transaction's)
			}
			if errno != 0 && first == nil {
				first = &TxError{Op: b.describe(seq), Errno: syscall.Errno(errno), Msg: extAckMsg(m)}
				first.Family, first.Table = messageTable(b.message(seq))
			}
			if seq == lastSeq {
				done = true
			}
		}
		if done || (first != nil && !k.pending()) {
			return first, nil
		}
	}
}

// drain discards what is queued on the socket, after an overflow left part
// of a transaction's answers there.
func (k *Kernel) drain() {
	buf := make([]byte, 1<<16)
	for k.pending() {
		if _, _, err := unix.Recvfrom(k.fd, buf, unix.MSG_DONTWAIT); err != nil &&
			!errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// fits checks a transaction against the socket's send buffer: the kernel
// refuses a larger message whole (EMSGSIZE), and would again at every retry.
func (k *Kernel) fits(chunks [][]byte) error {
	size := 0
	for _, c := range chunks {
		size += len(c)
	}
	sndbuf, err := unix.GetsockoptInt(k.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		return fmt.Errorf("reading the netlink send buffer size: %w", err)
	}
	// netlink_sendmsg takes messages up to sk_sndbuf - 32 bytes.
	if limit := sndbuf - 32; size > limit {
		return &txTooLargeError{Size: size, Limit: limit}
	}
	return nil
}

// setSendBuffer sets SO_SNDBUF (capped by net.core.wmem_max), for tests
// that need a small buffer.
func (k *Kernel) setSendBuffer(n int) error {
	return unix.SetsockoptInt(k.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
}

// setReceiveBuffer sets SO_RCVBUF (capped by net.core.rmem_max), for tests
// that need answers lost.
func (k *Kernel) setReceiveBuffer(n int) error {
	return unix.SetsockoptInt(k.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
}

// queueUnread asks for n answers (the ruleset generation) and leaves them
// unread on the socket, for tests that need its receive queue full: the
// kernel then drops the answers that follow, as it does when a transaction
// answers more than the buffer takes. The next transaction drains them.
func (k *Kernel) queueUnread(n int) error {
	for range n {
		req, _ := k.request(unix.NFT_MSG_GETGEN, unix.NLM_F_ACK, unix.NFPROTO_UNSPEC, nil)
		if err := unix.Sendto(k.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("asking for the nftables generation: %w", err)
		}
	}
	return nil
}

// pending reports whether more answers are queued on the socket.
func (k *Kernel) pending() bool {
	fds := []unix.PollFd{{Fd: int32(k.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// extAckMsg returns the NLMSGERR_ATTR_MSG text of an extended ack.
func extAckMsg(m syscall.NetlinkMessage) string {
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 {
		return ""
	}
	// With NETLINK_CAP_ACK the error carries only the request's header.
	attrs := m.Data[4+nlmsgHdrLen:]
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs[0:]))
		typ := binary.NativeEndian.Uint16(attrs[2:])
		if l < 4 || l > len(attrs) {
			break
		}
		if typ == unix.NLMSGERR_ATTR_MSG {
			s := attrs[4:l]
			for len(s) > 0 && s[len(s)-1] == 0 {
				s = s[:len(s)-1]
			}
			return string(s)
		}
		attrs = attrs[(l+3)&^3:]
	}
	return ""
}

// startBatch starts a batch numbered after the last one sent.
func (k *Kernel) startBatch() *batch { return newBatch(k.seq) }

// finished advances the sequence past a batch.
func (k *Kernel) finished(b *batch) { k.seq = b.seq }
