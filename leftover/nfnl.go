package leftover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// conn is a netfilter netlink socket that reads nftables objects and sends
// deletions, in the network namespace it was opened in. It reads only the
// attributes it needs (names, handles, hooks, jump targets), so that any
// rule, whatever its expressions (iptables-nft's xtables matches and
// targets included), can be listed.
type conn struct {
	fd  int
	seq uint32
	buf []byte
}

// openConn opens the socket in the current network namespace or the one
// at netnsPath.
func openConn(netnsPath string) (*conn, error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	// A cleanup of a large iptables-mode ruleset deletes tens of thousands
	// of chains in one transaction: the send buffer must hold it.
	const sndBuf = 256 << 20
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sndBuf); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndBuf)
	}
	// A refused transaction has an error per refused message, queued at
	// once (as nft/kernel.go's socket, 8 MiB); the *FORCE option passes
	// net.core.rmem_max, which we may (CAP_NET_ADMIN).
	const rcvBuf = 8 << 20
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return &conn{fd: fd, buf: make([]byte, 1<<17)}, nil
}

func (c *conn) close() error { return unix.Close(c.fd) }

const nfgenLen = 4

// header appends a netlink header and nfgenmsg for an nftables message.
func header(b []byte, msg uint16, flags uint16, seq uint32, family uint8) []byte {
	start := len(b)
	b = append(b, make([]byte, nlmsg.HdrLen+nfgenLen)...)
	h := b[start:]
	binary.NativeEndian.PutUint16(h[4:], unix.NFNL_SUBSYS_NFTABLES<<8|msg)
	binary.NativeEndian.PutUint16(h[6:], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(h[8:], seq)
	h[nlmsg.HdrLen] = family
	h[nlmsg.HdrLen+1] = unix.NFNETLINK_V0
	return b
}

// message is one complete nftables message with attributes.
func message(msg, flags uint16, seq uint32, family uint8, attrs nlmsg.Attrs) []byte {
	b := header(nil, msg, flags, seq, family)
	b = append(b, attrs...)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

func strAttr(a *nlmsg.Attrs, typ uint16, s string) { a.Put(typ, append([]byte(s), 0)...) }

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// dump sends a dump request and calls fn with each answer's family and
// attributes until the dump is done.
func (c *conn) dump(msg uint16, family uint8, attrs nlmsg.Attrs, fn func(family uint8, attrs []byte)) error {
	c.seq++
	seq := c.seq
	if err := nlmsg.Send(c.fd, message(msg, unix.NLM_F_DUMP|unix.NLM_F_ACK, seq, family, attrs)); err != nil {
		return err
	}
	for done := false; !done; {
		var failed error
		err := nlmsg.Receive(c.fd, c.buf, func(typ uint16, s uint32, p []byte) {
			if s != seq {
				return
			}
			switch {
			case typ == unix.NLMSG_DONE:
				done = true
			case typ == unix.NLMSG_ERROR:
				if e := nlmsg.Errno(p); e != 0 {
					failed = e
				}
				done = true
			case len(p) >= nfgenLen:
				fn(p[0], p[nfgenLen:])
			}
		})
		if err != nil {
			return err
		}
		if failed != nil {
			return failed
		}
	}
	return nil
}

// table is an nftables table: its family and name.
type table struct {
	family uint8
	name   string
}

func (t table) String() string { return familyName(t.family) + " " + t.name }

// tables lists every table of the network namespace.
func (c *conn) tables() ([]table, error) {
	var out []table
	err := c.dump(unix.NFT_MSG_GETTABLE, unix.NFPROTO_UNSPEC, nil, func(f uint8, attrs []byte) {
		nlmsg.Walk(attrs, func(typ uint16, data []byte) {
			if typ == unix.NFTA_TABLE_NAME {
				out = append(out, table{f, cstr(data)})
			}
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	return out, nil
}

// chain is a chain of a table; base chains hook into the stack.
type chain struct {
	name string
	base bool
}

// chains lists the chains of table t.
func (c *conn) chains(t table) ([]chain, error) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_CHAIN_TABLE, t.name)
	var out []chain
	err := c.dump(unix.NFT_MSG_GETCHAIN, t.family, a, func(f uint8, attrs []byte) {
		var ch chain
		var tbl string
		nlmsg.Walk(attrs, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_CHAIN_TABLE:
				tbl = cstr(data)
			case unix.NFTA_CHAIN_NAME:
				ch.name = cstr(data)
			case unix.NFTA_CHAIN_HOOK:
				ch.base = true
			}
		})
		// Older kernels ignore the table in a chain dump request.
		if f == t.family && tbl == t.name {
			out = append(out, ch)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing the chains of table %s: %w", t, err)
	}
	return out, nil
}

// hasChain reports whether table t has a chain of that name, with one
// request rather than a dump.
func (c *conn) hasChain(t table, name string) (bool, error) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_CHAIN_TABLE, t.name)
	strAttr(&a, unix.NFTA_CHAIN_NAME, name)
	c.seq++
	seq := c.seq
	if err := nlmsg.Send(c.fd, message(unix.NFT_MSG_GETCHAIN, unix.NLM_F_ACK, seq, t.family, a)); err != nil {
		return false, err
	}
	found := false
	for done := false; !done; {
		var failed error
		err := nlmsg.Receive(c.fd, c.buf, func(typ uint16, s uint32, p []byte) {
			if s != seq {
				return
			}
			switch typ {
			case unix.NLMSG_ERROR:
				if e := nlmsg.Errno(p); e != 0 && e != unix.ENOENT {
					failed = e
				}
				done = true
			case unix.NLMSG_DONE:
				done = true
			default:
				found = true
			}
		})
		if err != nil {
			return false, err
		}
		if failed != nil {
			return false, fmt.Errorf("looking up chain %s in table %s: %w", name, t, failed)
		}
	}
	return found, nil
}

// rule is a rule's place and the chains its verdicts jump or go to.
type rule struct {
	chain   string
	handle  uint64
	targets []string
}

// rules lists the rules of table t with their jump and goto targets.
func (c *conn) rules(t table) ([]rule, error) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_RULE_TABLE, t.name)
	var out []rule
	err := c.dump(unix.NFT_MSG_GETRULE, t.family, a, func(f uint8, attrs []byte) {
		var r rule
		var tbl string
		nlmsg.Walk(attrs, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_RULE_TABLE:
				tbl = cstr(data)
			case unix.NFTA_RULE_CHAIN:
				r.chain = cstr(data)
			case unix.NFTA_RULE_HANDLE:
				if len(data) == 8 {
					r.handle = binary.BigEndian.Uint64(data)
				}
			case unix.NFTA_RULE_EXPRESSIONS:
				r.targets = jumpTargets(data)
			}
		})
		if f == t.family && tbl == t.name {
			out = append(out, r)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing the rules of table %s: %w", t, err)
	}
	return out, nil
}

// jumpTargets returns the chains that the immediate verdicts (jump, goto)
// of a rule's expression list name.
func jumpTargets(exprs []byte) []string {
	var out []string
	nlmsg.Walk(exprs, func(typ uint16, elem []byte) {
		if typ != unix.NFTA_LIST_ELEM {
			return
		}
		var name string
		var data []byte
		nlmsg.Walk(elem, func(typ uint16, d []byte) {
			switch typ {
			case unix.NFTA_EXPR_NAME:
				name = cstr(d)
			case unix.NFTA_EXPR_DATA:
				data = d
			}
		})
		if name != "immediate" {
			return
		}
		nlmsg.Walk(data, func(typ uint16, d []byte) {
			if typ != unix.NFTA_IMMEDIATE_DATA {
				return
			}
			nlmsg.Walk(d, func(typ uint16, v []byte) {
				if typ != unix.NFTA_DATA_VERDICT {
					return
				}
				var code int32
				var target string
				nlmsg.Walk(v, func(typ uint16, x []byte) {
					switch typ {
					case unix.NFTA_VERDICT_CODE:
						if len(x) == 4 {
							code = int32(binary.BigEndian.Uint32(x))
						}
					case unix.NFTA_VERDICT_CHAIN:
						target = cstr(x)
					}
				})
				if (code == unix.NFT_JUMP || code == unix.NFT_GOTO) && target != "" {
					out = append(out, target)
				}
			})
		})
	})
	return out
}

// tx is a transaction under construction: deletions only.
type tx struct {
	msgs [][]byte
	what []string // what each message does, for errors
}

func (t *tx) delTable(tb table) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_TABLE_NAME, tb.name)
	t.add(unix.NFT_MSG_DELTABLE, tb.family, a, "delete table "+tb.String())
}

func (t *tx) delRule(tb table, ch string, handle uint64) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_RULE_TABLE, tb.name)
	strAttr(&a, unix.NFTA_RULE_CHAIN, ch)
	a.Put(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle)...)
	t.add(unix.NFT_MSG_DELRULE, tb.family, a, fmt.Sprintf("delete rule %s %s handle %d", tb, ch, handle))
}

// flushChain deletes every rule of a chain (a DELRULE without a handle).
func (t *tx) flushChain(tb table, ch string) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_RULE_TABLE, tb.name)
	strAttr(&a, unix.NFTA_RULE_CHAIN, ch)
	t.add(unix.NFT_MSG_DELRULE, tb.family, a, "flush chain "+tb.String()+" "+ch)
}

func (t *tx) delChain(tb table, ch string) {
	var a nlmsg.Attrs
	strAttr(&a, unix.NFTA_CHAIN_TABLE, tb.name)
	strAttr(&a, unix.NFTA_CHAIN_NAME, ch)
	t.add(unix.NFT_MSG_DELCHAIN, tb.family, a, "delete chain "+tb.String()+" "+ch)
}

// add appends a message; commit sets its sequence number and flags.
func (t *tx) add(msg uint16, family uint8, a nlmsg.Attrs, what string) {
	t.msgs = append(t.msgs, message(msg, 0, 0, family, a))
	t.what = append(t.what, what)
}

// TxError is a transaction the kernel refused; nothing of it was applied.
type TxError struct {
	Op    string
	Errno syscall.Errno
}

func (e *TxError) Error() string {
	return fmt.Sprintf("nftables transaction refused at %q: %v", e.Op, e.Errno)
}

func (e *TxError) Unwrap() error { return e.Errno }

// errAnswersLost is a transaction whose answers the kernel dropped (the
// socket's receive queue overflowed): it may have been applied or not, and
// only reading the state back tells.
var errAnswersLost = errors.New("the kernel dropped the transaction's answers (receive buffer full)")

// commit sends t as one nftables transaction (batch begin, the messages,
// batch end) and waits for the kernel's verdict. Only the last message asks
// for an ack: the kernel handles the whole batch before it answers, and
// reports an error for each refused message whatever its flags, so that a
// success is one ack, not one per message (tens of thousands of acks
// overflow any receive buffer). Answers lost all the same (a refusal with
// an error per message) give errAnswersLost.
func (c *conn) commit(t *tx) error {
	if len(t.msgs) == 0 {
		return nil
	}
	first := c.seq + 1
	b := c.encode(t)
	last := c.seq - 1
	if err := nlmsg.Send(c.fd, b); err != nil {
		return fmt.Errorf("sending a transaction of %d bytes: %w", len(b), err)
	}
	refused, err := c.result(first, last)
	if errors.Is(err, unix.ENOBUFS) {
		c.drain()
		return fmt.Errorf("reading the transaction's result: %w", errAnswersLost)
	}
	if err != nil {
		return fmt.Errorf("reading the transaction's result: %w", err)
	}
	if refused != nil {
		if refused.seq > first && refused.seq <= last {
			refused.Op = t.what[refused.seq-first-1]
		}
		return refused.TxError
	}
	return nil
}

// encode numbers t's messages from c.seq on and frames them as one batch,
// the last message asking for an ack.
func (c *conn) encode(t *tx) []byte {
	var b []byte
	batch := func(typ uint16) {
		c.seq++
		start := len(b)
		b = append(b, make([]byte, nlmsg.HdrLen+nfgenLen)...)
		h := b[start:]
		binary.NativeEndian.PutUint32(h, nlmsg.HdrLen+nfgenLen)
		binary.NativeEndian.PutUint16(h[4:], typ)
		binary.NativeEndian.PutUint16(h[6:], unix.NLM_F_REQUEST)
		binary.NativeEndian.PutUint32(h[8:], c.seq)
		binary.BigEndian.PutUint16(h[nlmsg.HdrLen+2:], unix.NFNL_SUBSYS_NFTABLES)
	}
	batch(unix.NFNL_MSG_BATCH_BEGIN)
	for i, m := range t.msgs {
		c.seq++
		binary.NativeEndian.PutUint32(m[8:], c.seq)
		flags := uint16(unix.NLM_F_REQUEST)
		if i == len(t.msgs)-1 {
			flags |= unix.NLM_F_ACK
		}
		binary.NativeEndian.PutUint16(m[6:], flags)
		b = append(b, m...)
	}
	batch(unix.NFNL_MSG_BATCH_END)
	return b
}

// refusal is the first error of a transaction, with the sequence number
// of the message it answers.
type refusal struct {
	*TxError
	seq uint32
}

// result reads a transaction's answers until the ack of its last message
// (seq last) or, after an error, until nothing more is queued.
func (c *conn) result(first, last uint32) (*refusal, error) {
	var refused *refusal
	for done := false; !done; {
		err := nlmsg.Receive(c.fd, c.buf, func(typ uint16, s uint32, p []byte) {
			if typ != unix.NLMSG_ERROR || s < first || s > last+1 {
				return
			}
			if e := nlmsg.Errno(p); e != 0 && refused == nil {
				refused = &refusal{&TxError{Op: "batch", Errno: e}, s}
			}
			done = done || s == last
		})
		if err != nil {
			return refused, err
		}
		// The kernel queues every answer of a batch at once: after an
		// error, what is not queued yet will not come.
		done = done || (refused != nil && !c.pending())
	}
	return refused, nil
}

// drain discards what is queued on the socket, after an overflow left
// part of a transaction's answers there.
func (c *conn) drain() {
	for c.pending() {
		if err := nlmsg.Receive(c.fd, c.buf, func(uint16, uint32, []byte) {}); err != nil && !errors.Is(err, unix.ENOBUFS) {
			return
		}
	}
}

// pending reports whether answers are queued on the socket.
func (c *conn) pending() bool {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}
