package nftlib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// monitor follows the nf_tables notifications of the Kernel's network
// namespace (the NFNLGRP_NFTABLES group) and remembers which of the watched
// tables another process than our Kernel changed: those, and only those,
// may differ from what we wrote. A goroutine reads the socket as events
// come, so that a burst of foreign commits between two checks needs only
// room for the burst; take, at check time, reads what is still queued.
//
// Every notification carries the committer's netlink port id in nlmsg_pid
// and the table's name in attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE,
// NFTA_RULE_TABLE, NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE,
// NFTA_FLOWTABLE_TABLE are all 1). Lost events (ENOBUFS) and messages we
// do not understand mark every watched table.
type monitor struct {
	f     *os.File
	me    uint32 // our Kernel's port id
	watch map[TableRef]bool
	done  chan struct{}
	// onMark, when set, is called (from the reader) when a table gets
	// marked while none was.
	onMark func()
	// others is signalled (never blocking) when another process changed
	// a table that is not watched, or events were lost; closed once the
	// monitor stops (othersClosed, under mu). See Kernel.OtherChanges.
	others       chan struct{}
	othersClosed bool

	mu sync.Mutex
	// scopes has, per table another process changed, what it changed.
	scopes map[TableRef]*ChangeScope
	all    bool // events were lost or not understood: everything may differ
	broken bool // the socket failed: no more events will come
	buf    []byte
	// events counts the notifications parsed (our own included, should
	// the kernel's filter let any through), overruns the ENOBUFS seen:
	// the monitor's statistics, see Counts.
	events, overruns int
}

// MonitorRcvBuf is the monitor socket's receive buffer: room for the
// notifications of a burst of foreign commits (ours are filtered out
// before they are queued).
const MonitorRcvBuf = 16 << 20

// openMonitor opens a monitor in k's network namespace for the given
// tables. It filters out the notifications of k's own transactions in the
// kernel, so that our large commits cannot fill its buffer.
func (k *Kernel) openMonitor(watch []TableRef, rcvBuf int, onMark func()) (*monitor, error) {
	me := k.PortID()
	if me == 0 {
		return nil, errors.New("cannot read our netlink port id")
	}
	fd, err := netns.NetlinkSocket(k.netns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	fail := func(what string, err error) (*monitor, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf); err != nil {
			return fail("sizing the monitor's receive buffer", err)
		}
	}
	// Drop, in the kernel, every skb whose first message comes from our
	// Kernel's socket: a commit's notifications are batched per commit, so
	// a whole skb is ours or not. Classic BPF loads words big endian;
	// nlmsg_pid (offset 12) is in host order.
	var pid [4]byte
	binary.NativeEndian.PutUint32(pid[:], me)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 12},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: binary.BigEndian.Uint32(pid[:])},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		return fail("filtering our own notifications out", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
		return fail("joining the nftables notification group", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail("making the monitor socket non-blocking", err)
	}
	m := &monitor{
		f:      os.NewFile(uintptr(fd), "nftables-monitor"),
		me:     me,
		watch:  map[TableRef]bool{},
		done:   make(chan struct{}),
		scopes: map[TableRef]*ChangeScope{},
		buf:    make([]byte, 1<<16),
		onMark: onMark,
		others: make(chan struct{}, 1),
	}
	for _, t := range watch {
		m.watch[t] = true
	}
	rc, err := m.f.SyscallConn()
	if err != nil {
		m.f.Close()
		return nil, fmt.Errorf("polling the monitor socket: %w", err)
	}
	go m.run(rc)
	return m, nil
}

// run reads notifications as they come, until the socket is closed.
func (m *monitor) run(rc syscall.RawConn) {
	defer close(m.done)
	defer func() {
		m.mu.Lock()
		m.othersClosed = true
		close(m.others)
		m.mu.Unlock()
	}()
	err := rc.Read(func(fd uintptr) bool {
		m.mu.Lock()
		before := m.pendingLocked()
		stop := m.drainLocked(int(fd)) // false: wait for more
		marked := !before && m.pendingLocked()
		m.mu.Unlock()
		if marked && m.onMark != nil {
			m.onMark()
		}
		return stop
	})
	if err != nil {
		m.mu.Lock()
		m.broken, m.all = true, true
		m.mu.Unlock()
	}
}

// drainLocked reads every queued message without blocking; it reports
// whether the socket failed for good. Reading only under mu means no
// message is ever read and not yet counted.
func (m *monitor) drainLocked(fd int) bool {
	for {
		n, _, err := unix.Recvfrom(fd, m.buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return false
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			// The kernel dropped notifications: we cannot say whose.
			m.overruns++
			m.all = true
			m.otherLocked()
			continue
		case err != nil:
			m.broken, m.all = true, true
			return true
		}
		m.parse(m.buf[:n])
	}
}

// parse marks the watched tables that the notifications in b name, unless
// our Kernel sent them.
func (m *monitor) parse(b []byte) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		m.all = true
		m.otherLocked()
		return
	}
	for _, msg := range msgs {
		m.events++
		if msg.Header.Pid == m.me {
			continue
		}
		typ := msg.Header.Type
		if typ == unix.NLMSG_NOOP || typ == unix.NLMSG_DONE {
			continue
		}
		if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(msg.Data) < NfgenLen {
			m.all = true
			m.otherLocked()
			continue
		}
		if typ&0xff == unix.NFT_MSG_NEWGEN {
			continue // ends a transaction; names no table
		}
		table, ok := eventTable(msg.Data[NfgenLen:])
		if !ok {
			m.all = true
			m.otherLocked()
			continue
		}
		t := TableRef{Family(msg.Data[0]), table}
		if m.watch[t] {
			m.markLocked(t, typ&0xff, msg.Data[NfgenLen:])
		} else {
			m.otherLocked()
		}
	}
}

// eventTable reads the table an event names: attribute 1 in every object
// message.
func eventTable(attrs []byte) (table string, ok bool) {
	parsed := forAttrs(attrs, func(a nlAttr) {
		if a.typ == 1 && !ok {
			table, ok = a.str(), true
		}
	})
	return table, parsed && ok
}

// markLocked adds an event of type typ to its table's scope: the chain of
// a chain or rule event, the set of a set or element event, whether it is
// a table or stateful object event; anything else makes it whole.
func (m *monitor) markLocked(t TableRef, typ uint16, attrs []byte) {
	sc := m.scopes[t]
	if sc == nil {
		sc = &ChangeScope{}
		m.scopes[t] = sc
	}
	if sc.Whole {
		return // names tell nothing more (a deleted table names all it held)
	}
	switch typ {
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		sc.Chains = addName(sc.Chains, attrs, unix.NFTA_RULE_CHAIN)
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		sc.Chains = addName(sc.Chains, attrs, unix.NFTA_CHAIN_NAME)
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		sc.Sets = addName(sc.Sets, attrs, unix.NFTA_SET_ELEM_LIST_SET)
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		sc.Sets = addName(sc.Sets, attrs, unix.NFTA_SET_NAME)
	case unix.NFT_MSG_NEWTABLE:
		sc.Table = true
	case unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ, unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE:
		sc.Stateful = true
	default:
		sc.Whole = true
	}
	if sc.Whole || sc.Chains[""] || sc.Sets[""] { // "": an event without the name it should carry
		*sc = ChangeScope{Whole: true}
	}
}

// addName adds to names the string attribute attr of attrs ("" without).
func addName(names map[string]bool, attrs []byte, attr uint16) map[string]bool {
	if names == nil {
		names = map[string]bool{}
	}
	name := ""
	forAttrs(attrs, func(a nlAttr) {
		if a.typ == attr && name == "" {
			name = a.str()
		}
	})
	names[name] = true
	return names
}

// otherLocked signals others: another process changed a table we do not
// watch, or we cannot tell which tables changed.
func (m *monitor) otherLocked() {
	if m.othersClosed {
		return
	}
	select {
	case m.others <- struct{}{}:
	default:
	}
}

// pendingLocked reports whether a table is marked (or all are).
func (m *monitor) pendingLocked() bool { return m.all || len(m.scopes) > 0 }

// Pending reports whether another process changed one of our tables since
// the last take, as far as the events read so far tell.
func (m *monitor) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pendingLocked()
}

// Take reads what is queued, then returns and clears the marks: the
// tables another process changed since the last take, or all when events
// were lost or the monitor broke (it then stays all). Events that arrive
// after take stay for the next one.
func (m *monitor) Take() (marked map[TableRef]bool, all bool) {
	scopes, all := m.TakeScopes()
	marked = make(map[TableRef]bool, len(scopes))
	for t := range scopes {
		marked[t] = true
	}
	return marked, all
}

// ChangeScope is what another process changed in one table: the chains
// (added, deleted, changed, or their rules) and sets (likewise, or their
// elements) named, the table's own attributes (Table), its stateful
// objects or flowtables (Stateful); or anything (Whole: the table deleted,
// or an event not understood).
type ChangeScope struct {
	Whole, Table, Stateful bool
	Chains, Sets           map[string]bool
}

// TakeScopes is Take with what changed in each marked table.
func (m *monitor) TakeScopes() (scopes map[TableRef]ChangeScope, all bool) {
	rc, err := m.f.SyscallConn()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			if m.drainLocked(int(fd)) {
				m.broken = true
			}
		})
	}
	if err != nil {
		m.broken = true
	}
	scopes = make(map[TableRef]ChangeScope, len(m.scopes))
	for t, sc := range m.scopes {
		scopes[t] = *sc
	}
	all = m.all || m.broken
	m.scopes, m.all = map[TableRef]*ChangeScope{}, false
	return scopes, all
}

// Counts returns the events parsed and the overruns seen. Nothing in the
// proxy reports them (an overrun already marks every table, which the
// drift check acts on); they tell the monitor's tests whether the kernel
// dropped our notifications and whether a test overflowed the buffer.
func (m *monitor) Counts() (events, overruns int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.events, m.overruns
}

// close stops the reader and closes the socket.
func (m *monitor) close() error {
	err := m.f.Close()
	<-m.done
	return err
}

// SetMember joins or leaves the notification group. While nobody listens
// the kernel does not even build notifications, a large part of a large
// full sync's kernel time (docs/benchmarks.md): the filter above drops
// ours only once they are built. So a large transaction of ours is sent
// with the monitor out of the group (see nft's committer.rejoin for what
// it may miss meanwhile).
func (m *monitor) SetMember(join bool) error {
	rc, err := m.f.SyscallConn()
	if err != nil {
		return err
	}
	opt := unix.NETLINK_DROP_MEMBERSHIP
	if join {
		opt = unix.NETLINK_ADD_MEMBERSHIP
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_NETLINK, opt, unix.NFNLGRP_NFTABLES)
	}); err != nil {
		return err
	}
	return serr
}

// MarkAll makes the next take report every table: events may have been
// missed. Like a notification, it calls onMark when nothing was pending:
// a commit that went unseen (one during our own) asks for a check at once,
// not at the periodic sync.
func (m *monitor) MarkAll() {
	m.mu.Lock()
	before := m.pendingLocked()
	m.all = true
	m.otherLocked()
	marked := !before && m.pendingLocked()
	m.mu.Unlock()
	if marked && m.onMark != nil {
		m.onMark()
	}
}

// TableRef names a table of one family.
type TableRef struct {
	Family Family
	Name   string
}

func (r TableRef) String() string { return r.Family.String() + " " + r.Name }
