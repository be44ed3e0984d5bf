package nftlib

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/parallel"
)

// batch encodes one nftables transaction: netlink messages between
// NFNL_MSG_BATCH_BEGIN and NFNL_MSG_BATCH_END, in one buffer, sent with one
// sendmsg. The kernel applies all of it or none of it.
//
// We encode the messages ourselves (google/nftables' Conn asks for an ack
// and an echo of every message, hundreds of thousands of replies for a full
// sync) and use google/nftables only for the expressions.
type batch struct {
	// Buf is the message being written; completed messages are copied into
	// chunks, so a batch of many MiB is never copied again as it grows.
	// Large chunks are mapped outside the Go heap (see newChunk); mapped
	// says which, for Release.
	Buf    []byte
	chunks [][]byte
	mapped []bool
	total  int
	seq    uint32
	start  int   // offset of the message being written (0: buf holds one message)
	nests  []int // offsets of open nested attributes
	count  int   // messages begun
	err    error
}

// Netlink attribute numbers golang.org/x/sys/unix does not define.
const (
	nftaTableUserdata = 6
	nftaChainUserdata = 12
	nfAccept          = 1
)

const (
	nlmsgHdrLen = 16
	NfgenLen    = 4
)

func newBatch(seq uint32) *batch {
	b := &batch{seq: seq}
	b.begin(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	b.Buf[b.start+nlmsgHdrLen+2] = 0
	binary.BigEndian.PutUint16(b.Buf[b.start+nlmsgHdrLen+2:], unix.NFNL_SUBSYS_NFTABLES)
	b.end()
	return b
}

// begin starts a message; typ is NFNL_MSG_BATCH_* or an NFT_MSG_* (the
// subsystem is added here).
func (b *batch) begin(typ uint16, flags uint16, family Family) {
	if typ != unix.NFNL_MSG_BATCH_BEGIN && typ != unix.NFNL_MSG_BATCH_END {
		typ |= unix.NFNL_SUBSYS_NFTABLES << 8
	}
	b.flushMessage()
	b.start = len(b.Buf)
	if b.start == 0 {
		b.Buf = b.room()
	}
	var hdr [nlmsgHdrLen + NfgenLen]byte
	binary.NativeEndian.PutUint16(hdr[4:], typ)
	binary.NativeEndian.PutUint16(hdr[6:], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(hdr[8:], b.seq)
	hdr[16] = byte(family)
	hdr[17] = unix.NFNETLINK_V0
	b.Buf = append(b.Buf, hdr[:]...)
	b.count++
	b.seq++
}

// flushMessage moves the completed message into the chunk list: a
// message written in place, at the end of the last chunk (see room), just
// joins it; one that outgrew the room left there was moved to the heap by
// append, and is copied.
func (b *batch) flushMessage() {
	if len(b.Buf) == 0 {
		return
	}
	n := len(b.chunks)
	switch {
	case n > 0 && b.inPlace():
		c := b.chunks[n-1]
		b.chunks[n-1] = c[:len(c)+len(b.Buf)]
	default:
		if n == 0 || len(b.chunks[n-1])+len(b.Buf) > cap(b.chunks[n-1]) {
			b.newChunk(len(b.Buf))
			n++
		}
		b.chunks[n-1] = append(b.chunks[n-1], b.Buf...)
	}
	b.total += len(b.Buf)
	b.Buf = nil
}

// minRoom is the room a chunk must have left for the next message to be
// written there in place: most messages (a rule, a chain, a few
// elements) are far smaller.
const minRoom = 4 << 10

// room returns the empty buffer the next message is written into: the
// free end of the last chunk, or of a new one. Encoding in place saves
// copying every message of a full sync once more.
func (b *batch) room() []byte {
	n := len(b.chunks)
	if n == 0 || cap(b.chunks[n-1])-len(b.chunks[n-1]) < minRoom {
		b.newChunk(minRoom)
		n++
	}
	c := b.chunks[n-1]
	return c[len(c):len(c):cap(c)]
}

// inPlace reports whether Buf is still the free end of the last chunk.
func (b *batch) inPlace() bool {
	c := b.chunks[len(b.chunks)-1]
	return cap(b.Buf) > 0 && cap(c) > len(c) && &b.Buf[:1][0] == &c[len(c) : len(c)+1][0]
}

// newChunk appends an empty chunk for at least need bytes. Chunks grow
// with the batch: small syncs stay small, big ones take few chunks.
func (b *batch) newChunk(need int) {
	size := max(min(max(b.total/2, 16<<10), 8<<20), need)
	c, mapped := newChunk(size)
	b.chunks, b.mapped = append(b.chunks, c), append(b.mapped, mapped)
}

// mapChunksFrom is the chunk size from which chunks are mapped outside the
// Go heap: only batches of a few MiB and more (full syncs) have them.
const mapChunksFrom = 1 << 20

// newChunk returns an empty buffer of capacity size. The large chunks of a
// full sync, which grow with the ruleset, are anonymous mappings rather
// than heap memory: on the heap they would raise the garbage
// collector's goal (twice the live heap) by twice their size while the new
// rules are alive too, which set the proxy's peak RSS, and their pages
// would stay with the process until the runtime scavenged them. A mapping
// is returned to the kernel as soon as the batch is sent (Release).
func newChunk(size int) (c []byte, mapped bool) {
	if size >= mapChunksFrom {
		m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err == nil {
			return m[:0], true
		}
		// Out of address space or mappings: the heap will do.
	}
	return make([]byte, 0, size), false
}

// release unmaps the batch's mapped chunks; the batch holds no messages
// afterwards. Kernel.Apply calls it once the batch is sent: nothing may
// use the chunks finish returned after that.
func (b *batch) release() {
	for i, c := range b.chunks {
		if b.mapped[i] {
			// Munmap fails only for a range that is not a mapping.
			_ = unix.Munmap(c[:cap(c)])
		}
	}
	b.chunks, b.mapped, b.Buf = nil, nil, nil
}

// Size is the batch's length in bytes so far.
func (b *batch) Size() int { return b.total + len(b.Buf) }

func (b *batch) end() {
	binary.NativeEndian.PutUint32(b.Buf[b.start:], uint32(len(b.Buf)-b.start))
}

func (b *batch) attr(typ uint16, data []byte) {
	l := 4 + len(data)
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(l))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b.Buf = append(b.Buf, h[:]...)
	b.Buf = append(b.Buf, data...)
	b.pad()
}

func (b *batch) pad() {
	for len(b.Buf)%4 != 0 {
		b.Buf = append(b.Buf, 0)
	}
}

func (b *batch) str(typ uint16, s string) {
	l := 4 + len(s) + 1
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(l))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b.Buf = append(b.Buf, h[:]...)
	b.Buf = append(b.Buf, s...)
	b.Buf = append(b.Buf, 0)
	b.pad()
}

func (b *batch) u32(typ uint16, v uint32) {
	var a [8]byte
	binary.NativeEndian.PutUint16(a[0:], 8)
	binary.NativeEndian.PutUint16(a[2:], typ)
	binary.BigEndian.PutUint32(a[4:], v)
	b.Buf = append(b.Buf, a[:]...)
}

func (b *batch) nest(typ uint16) {
	b.nests = append(b.nests, len(b.Buf))
	b.Buf = append(b.Buf, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(b.Buf[len(b.Buf)-2:], typ|unix.NLA_F_NESTED)
}

func (b *batch) unnest() {
	off := b.nests[len(b.nests)-1]
	b.nests = b.nests[:len(b.nests)-1]
	l := len(b.Buf) - off
	if l > 0xffff && b.err == nil {
		b.err = fmt.Errorf("netlink attribute of %d bytes is over the 64 KiB limit", l)
	}
	binary.NativeEndian.PutUint16(b.Buf[off:], uint16(l))
}

// userdata encodes a comment as libnftnl does: one TLV (type 0 is the
// comment for rules, chains, tables and set elements), NUL-terminated.
// commentAttr appends an attribute holding userdataComment(typ, c)
// without building it apart: every rule and element has one.
func (b *batch) commentAttr(attr uint16, typ byte, c string) {
	var h [6]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(4+2+len(c)+1))
	binary.NativeEndian.PutUint16(h[2:], attr)
	h[4], h[5] = typ, byte(len(c)+1)
	b.Buf = append(b.Buf, h[:]...)
	b.Buf = append(b.Buf, c...)
	b.Buf = append(b.Buf, 0)
	b.pad()
}

func userdataComment(typ byte, c string) []byte {
	out := []byte{typ, byte(len(c) + 1)}
	out = append(out, c...)
	return append(out, 0)
}

// MaxComment bounds a comment in bytes: nft refuses comments over 128
// bytes (NFTNL_UDATA_COMMENT_MAXLEN); we keep one byte of margin.
const MaxComment = 127

// clampComment makes a comment that nft accepts and prints back as it is,
// the same in render text and netlink userdata: at most MaxComment bytes,
// cut at a rune boundary, and without what nft's quoted strings cannot
// hold (a quote; nor escapes, so no backslash or unprintable rune).
func clampComment(c string) string {
	if !plainComment(c) {
		c = sanitizeComment(c)
	}
	if len(c) <= MaxComment {
		return c
	}
	n := MaxComment
	for n > 0 && !utf8.RuneStart(c[n]) {
		n--
	}
	return c[:n]
}

// plainComment reports whether c is printable ASCII without quote or
// backslash: the common case, returned as it is without allocating.
func plainComment(c string) bool {
	for i := 0; i < len(c); i++ {
		if ch := c[i]; ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\' {
			return false
		}
	}
	return true
}

func sanitizeComment(c string) string {
	var b strings.Builder
	for _, r := range c { // invalid UTF-8 comes as utf8.RuneError
		if r == '"' || r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// quoteComment is a comment as nft prints it.
func quoteComment(c string) string { return `"` + clampComment(c) + `"` }

func (b *batch) AddTable(f Family, name, comment string) {
	b.begin(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_TABLE_NAME, name)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	if comment != "" {
		b.commentAttr(nftaTableUserdata, 0, clampComment(comment))
	}
	b.end()
}

// AddOwnedTable creates an empty table that only this socket may change
// and that the kernel deletes when the socket closes (NFT_TABLE_F_OWNER,
// Linux 5.12+; older kernels refuse the flag with EOPNOTSUPP). It fails
// with EEXIST when the table exists, or EPERM when another socket owns it.
func (b *batch) AddOwnedTable(f Family, name, comment string) {
	b.begin(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, f)
	b.str(unix.NFTA_TABLE_NAME, name)
	b.u32(unix.NFTA_TABLE_FLAGS, NftTableFOwner)
	if comment != "" {
		b.commentAttr(nftaTableUserdata, 0, clampComment(comment))
	}
	b.end()
}

func (b *batch) DelTable(f Family, name string) {
	b.begin(unix.NFT_MSG_DELTABLE, 0, f)
	b.str(unix.NFTA_TABLE_NAME, name)
	b.end()
}

func (b *batch) delSet(f Family, table, name string) {
	b.begin(unix.NFT_MSG_DELSET, 0, f)
	b.str(unix.NFTA_SET_TABLE, table)
	b.str(unix.NFTA_SET_NAME, name)
	b.end()
}

// delObj deletes a stateful object, named by its type and name.
func (b *batch) delObj(f Family, table string, o kernelObject) {
	b.begin(unix.NFT_MSG_DELOBJ, 0, f)
	b.str(unix.NFTA_OBJ_TABLE, table)
	b.str(unix.NFTA_OBJ_NAME, o.Name)
	b.u32(unix.NFTA_OBJ_TYPE, o.Type)
	b.end()
}

func (b *batch) delFlowtable(f Family, table, name string) {
	b.begin(unix.NFT_MSG_DELFLOWTABLE, 0, f)
	b.str(nftaFlowtableTable, table)
	b.str(nftaFlowtableName, name)
	b.end()
}

var hookNumbers = map[string]uint32{
	"prerouting": unix.NF_INET_PRE_ROUTING, "input": unix.NF_INET_LOCAL_IN, "forward": unix.NF_INET_FORWARD,
	"output": unix.NF_INET_LOCAL_OUT, "postrouting": unix.NF_INET_POST_ROUTING,
}

func (b *batch) AddChain(f Family, table string, c *Chain) {
	b.begin(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_CHAIN_TABLE, table)
	b.str(unix.NFTA_CHAIN_NAME, c.Name)
	if h := c.Hook; h != nil {
		b.nest(unix.NFTA_CHAIN_HOOK)
		b.u32(unix.NFTA_HOOK_HOOKNUM, hookNumbers[h.Hook])
		b.u32(unix.NFTA_HOOK_PRIORITY, uint32(h.Priority))
		b.unnest()
		b.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		b.str(unix.NFTA_CHAIN_TYPE, h.Type)
	}
	if c.Comment != "" {
		b.commentAttr(nftaChainUserdata, 0, clampComment(c.Comment))
	}
	b.end()
}

func (b *batch) DelChain(f Family, table, name string) {
	b.begin(unix.NFT_MSG_DELCHAIN, 0, f)
	b.str(unix.NFTA_CHAIN_TABLE, table)
	b.str(unix.NFTA_CHAIN_NAME, name)
	b.end()
}

// FlushChain deletes every rule of a chain; with chain == "" of the whole table.
func (b *batch) FlushChain(f Family, table, chain string) {
	b.begin(unix.NFT_MSG_DELRULE, 0, f)
	b.str(unix.NFTA_RULE_TABLE, table)
	if chain != "" {
		b.str(unix.NFTA_RULE_CHAIN, chain)
	}
	b.end()
}

func (b *batch) AddRule(f Family, table, chain string, r Rule) {
	b.begin(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, f)
	b.str(unix.NFTA_RULE_TABLE, table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, t := range r.Terms {
		if d, ok := t.(directTerm); ok && d.direct(b, f) {
			continue
		}
		for _, e := range t.exprs(f) {
			b.expr(f, e)
		}
	}
	b.unnest()
	if r.Comment != "" {
		b.commentAttr(unix.NFTA_RULE_USERDATA, 0, clampComment(r.Comment))
	}
	b.end()
}

// addChainRules adds the rules of chains, in order.
func (b *batch) addChainRules(f Family, table string, chains []*Chain) {
	b.writeEach(len(chains), func(i int) int { return len(chains[i].Rules) }, func(part *batch, i int) {
		for _, r := range chains[i].Rules {
			part.AddRule(f, table, chains[i].Name, r)
		}
	})
}

// AddChains adds chains (without their rules), in order.
func (b *batch) AddChains(f Family, table string, chains []*Chain) {
	b.writeEach(len(chains), func(int) int { return 1 }, func(part *batch, i int) {
		part.AddChain(f, table, chains[i])
	})
}

// writeEach writes, in order of i, what write(part, i) writes for each of
// n items, count(i) messages each. A full sync's hundreds of thousands of
// messages are encoded on all CPUs, each part into a batch of its own
// whose messages are numbered as they will stand in this one, then joined
// in order; small ones straight into b.
func (b *batch) writeEach(n int, count func(i int) int, write func(part *batch, i int)) {
	parts := make([]*batch, parallel.Parts(n, ParallelMin))
	if len(parts) == 1 {
		for i := range n {
			write(b, i)
		}
		return
	}
	seq := b.seq
	for p := range parts {
		parts[p] = &batch{seq: seq}
		lo, hi := parallel.Range(n, len(parts), p)
		for i := lo; i < hi; i++ {
			seq += uint32(count(i))
		}
	}
	parallel.Run(n, ParallelMin, func(p, lo, hi int) {
		for i := lo; i < hi; i++ {
			write(parts[p], i)
		}
	})
	for _, part := range parts {
		b.join(part)
	}
}

// join appends the messages of part, which was numbered to follow b's.
// Like b's own, part's last message is still being written: it stays so.
func (b *batch) join(part *batch) {
	if part.count == 0 {
		return
	}
	b.flushMessage()
	b.chunks = append(b.chunks, part.chunks...)
	b.mapped = append(b.mapped, part.mapped...)
	b.total += part.total
	b.Buf = part.Buf // written in place in part's last chunk, now b's, or on the heap
	b.start = part.start
	b.count += part.count
	b.seq = part.seq
	if b.err == nil {
		b.err = part.err
	}
}

// concatType is nft's id for a concatenation of datatypes (6 bits each).
func concatType(f Family, key []Field) uint32 {
	var t uint32
	for _, fl := range key {
		_, id := fl.datatype(f)
		t = t<<6 | id
	}
	return t
}

func (b *batch) addMap(f Family, table string, m *Map, id uint32) {
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_SET_TABLE, table)
	b.str(unix.NFTA_SET_NAME, m.Name)
	b.u32(unix.NFTA_SET_FLAGS, m.flags())
	b.u32(unix.NFTA_SET_KEY_TYPE, concatType(f, m.Key))
	b.u32(unix.NFTA_SET_KEY_LEN, keyLen(f, m.Key))
	if !m.Plain {
		b.u32(unix.NFTA_SET_DATA_TYPE, VerdictType)
		b.u32(unix.NFTA_SET_DATA_LEN, 0)
	}
	b.u32(unix.NFTA_SET_ID, id)
	if m.Interval {
		b.concatDesc(f, m.Key)
	}
	if m.Comment != "" {
		b.commentAttr(unix.NFTA_SET_USERDATA, SetCommentType, clampComment(m.Comment))
	}
	b.end()
}

// flushMap deletes every element of a map.
func (b *batch) flushMap(f Family, table string, m *Map) {
	b.begin(unix.NFT_MSG_DELSETELEM, 0, f)
	b.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	b.str(unix.NFTA_SET_ELEM_LIST_SET, m.Name)
	b.end()
}

// elemChunk keeps each message's element list well under the 64 KiB
// attribute limit.
const elemChunk = 256

func (b *batch) Elements(add bool, f Family, table string, m *Map, elems []Element) {
	b.elementMessages(add, f, table, m.Name, len(elems), func(i int) {
		e := elems[i]
		b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, encodeKey(f, m.Key, e.Key))
		b.unnest()
		if m.Interval {
			b.nest(nftaSetElemKeyEnd)
			b.attr(unix.NFTA_DATA_VALUE, appendKey(nil, f, m.Key, e.Key, true))
			b.unnest()
		}
		if !add {
			return
		}
		if !m.Plain {
			b.nest(unix.NFTA_SET_ELEM_DATA)
			b.nest(unix.NFTA_DATA_VERDICT)
			v := e.Verdict.expr()
			b.u32(unix.NFTA_VERDICT_CODE, uint32(int32(v.Kind)))
			if v.Chain != "" {
				b.str(unix.NFTA_VERDICT_CHAIN, v.Chain)
			}
			b.unnest()
			b.unnest()
		}
		if e.Comment != "" {
			b.commentAttr(unix.NFTA_SET_ELEM_USERDATA, 0, clampComment(e.Comment))
		}
	})
}

// elementMessages adds (NEWSETELEM) or deletes (DELSETELEM) n elements of
// a set or map, elemChunk to a message; elem writes element i's attributes
// inside its NFTA_LIST_ELEM.
func (b *batch) elementMessages(add bool, f Family, table, set string, n int, elem func(i int)) {
	typ, flags := uint16(unix.NFT_MSG_DELSETELEM), uint16(0)
	if add {
		typ, flags = unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE
	}
	for start := 0; start < n; start += elemChunk {
		b.begin(typ, flags, f)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
		b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for i := start; i < min(n, start+elemChunk); i++ {
			b.nest(unix.NFTA_LIST_ELEM)
			elem(i)
			b.unnest()
		}
		b.unnest()
		b.end()
	}
}

// finish closes the batch, asking for an ack on the last real message only:
// errors are reported whatever the flags, and the kernel processes the whole
// batch before it answers, so that one ack tells us the batch is done.
func (b *batch) finish() (chunks [][]byte, lastSeq uint32, err error) {
	if b.err != nil {
		return nil, 0, b.err
	}
	last := b.start
	flags := binary.NativeEndian.Uint16(b.Buf[last+6:])
	binary.NativeEndian.PutUint16(b.Buf[last+6:], flags|unix.NLM_F_ACK)
	lastSeq = binary.NativeEndian.Uint32(b.Buf[last+8:])
	b.begin(unix.NFNL_MSG_BATCH_END, 0, 0)
	binary.BigEndian.PutUint16(b.Buf[b.start+nlmsgHdrLen+2:], unix.NFNL_SUBSYS_NFTABLES)
	b.end()
	b.flushMessage()
	return b.chunks, lastSeq, nil
}

// Messages is how many object messages (not counting begin/end) the batch holds.
func (b *batch) Messages() int { return b.count - 1 }

// describe says what the message with that sequence number did, read back
// from its encoding (a description kept per message would cost as much
// memory as a tenth of a full sync's batch, for the rare refusal).
func (b *batch) describe(seq uint32) string {
	if msg := b.message(seq); msg != nil {
		if what := describeMessage(msg); what != "" {
			return what
		}
	}
	return fmt.Sprintf("message %d", seq)
}

// message finds the encoded message with that sequence number.
func (b *batch) message(seq uint32) []byte {
	for _, c := range append(b.chunks[:len(b.chunks):len(b.chunks)], b.Buf) {
		for len(c) >= nlmsgHdrLen {
			l := int(binary.NativeEndian.Uint32(c))
			if l < nlmsgHdrLen || l > len(c) {
				break
			}
			if binary.NativeEndian.Uint32(c[8:]) == seq {
				return c[:l]
			}
			c = c[(l+3)&^3:]
		}
	}
	return nil
}

// describeMessage says what one of our messages does: a verb by its type,
// and the object it names.
func describeMessage(msg []byte) string {
	typ := binary.NativeEndian.Uint16(msg[4:])
	switch typ {
	case unix.NFNL_MSG_BATCH_BEGIN:
		return "batch begin"
	case unix.NFNL_MSG_BATCH_END:
		return "batch end"
	}
	if len(msg) < nlmsgHdrLen+NfgenLen {
		return ""
	}
	attrs := msg[nlmsgHdrLen+NfgenLen:]
	if typ&^(unix.NFNL_SUBSYS_NFTABLES<<8) == unix.NFT_MSG_DELRULE {
		return describeRuleDeletion(attrs)
	}
	kind, ok := messageKinds[typ&^(unix.NFNL_SUBSYS_NFTABLES<<8)]
	if !ok {
		return ""
	}
	verb := kind.verb
	switch typ &^ (unix.NFNL_SUBSYS_NFTABLES << 8) {
	case unix.NFT_MSG_NEWSET:
		if f, ok := findAttr(attrs, unix.NFTA_SET_FLAGS); ok && len(f) == 4 && binary.BigEndian.Uint32(f)&unix.NFT_SET_MAP != 0 {
			verb = "add map"
		}
	case unix.NFT_MSG_DELSETELEM:
		if _, ok := findAttr(attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS); ok {
			verb = "delete elements from"
		}
	}
	name, _ := findAttr(attrs, kind.name)
	return strings.TrimSpace(verb + " " + strings.TrimRight(string(name), "\x00"))
}

// messageTable returns the family and table an object message changes:
// every nf_tables object message names its table in attribute 1 (a table
// message its own name). "" for others (batch begin and end).
func messageTable(msg []byte) (Family, string) {
	if len(msg) < nlmsgHdrLen+NfgenLen || binary.NativeEndian.Uint16(msg[4:])>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return 0, ""
	}
	name, ok := findAttr(msg[nlmsgHdrLen+NfgenLen:], 1)
	if !ok {
		return 0, ""
	}
	return Family(msg[nlmsgHdrLen]), strings.TrimRight(string(name), "\x00")
}

// messageKinds are what our messages do, by type: a verb and the
// attribute that names the object.
var messageKinds = map[uint16]struct {
	verb string
	name uint16
}{
	unix.NFT_MSG_NEWTABLE:     {"add table", unix.NFTA_TABLE_NAME},
	unix.NFT_MSG_DELTABLE:     {"delete table", unix.NFTA_TABLE_NAME},
	unix.NFT_MSG_NEWCHAIN:     {"add chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_DELCHAIN:     {"delete chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_NEWRULE:      {"add rule to", unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_NEWSET:       {"add set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_DELSET:       {"delete set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_NEWSETELEM:   {"add elements to", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_DELSETELEM:   {"flush map", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_DELOBJ:       {"delete object", unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_DELFLOWTABLE: {"delete flowtable", nftaFlowtableName},
}

// findAttr returns the payload of the first top-level attribute of that type.
func findAttr(attrs []byte, typ uint16) ([]byte, bool) {
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs))
		if l < 4 || l > len(attrs) {
			return nil, false
		}
		if binary.NativeEndian.Uint16(attrs[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			return attrs[4:l], true
		}
		attrs = attrs[(l+3)&^3:]
	}
	return nil, false
}
