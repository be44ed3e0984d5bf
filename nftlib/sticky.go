package nftlib

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Sticky sessions: a table with Sticky holds one dynamic set of that name,
// keyed by a packet's source address and a 32-bit id of a target (StickyID
// of its chain's name), whose elements time out. StickyMatch looks the pair
// up, StickyUpdate adds or refreshes it from the packet path: a source sent
// to a target once is sent there again while its element lives. One set
// per table, not one per target, keeps a full sync linear in the number of
// targets: the kernel looks sets up by walking a list.
//
// nft (1.0.6 and later) parses a constant inside such a concatenation only
// as an expression it can type, so the id is written as
// `numgen random mod 1 offset ID`, which always yields ID.
//
// stickySetSize bounds the set: a source that finds it full is not
// remembered (its packets still go wherever the rules send them).
const stickySetSize = 1 << 20

// StickyID is the id of a target chain in the sticky set: the first four
// bytes of a hash of its name, so stable across restarts and without
// state. Two targets sharing an id would only make a source stick to the
// other one where both are matched.
func StickyID(chain string) uint32 {
	sum := sha256.Sum256([]byte(chain))
	return binary.BigEndian.Uint32(sum[:4])
}

// stickyKey loads `ip saddr . numgen random mod 1 offset ID` into
// registers, as nft lays the concatenation out: the address from register 1
// on, the id in the next 32-bit register.
func stickyKey(f Family, id uint32) []expr.Any {
	idReg := uint32(unix.NFT_REG32_01) // after the 4-byte IPv4 address
	if f == IPv6 {
		idReg = unix.NFT_REG_2 // after the 16-byte IPv6 address
	}
	return []expr.Any{
		FieldSaddr.load(f, unix.NFT_REG_1),
		&expr.Numgen{Register: idReg, Modulus: 1, Type: unix.NFT_NG_RANDOM, Offset: id},
	}
}

// stickyKeyAt reads stickyKey's expressions at the start of ex: the
// source address, then the target's id.
func stickyKeyAt(f Family, ex []expr.Any) (id uint32, ok bool) {
	p, ok := exprAt[*expr.Payload](ex, 0)
	if !ok {
		return 0, false
	}
	if fl, ok := payloadField(f, p); !ok || fl != FieldSaddr || int(p.Len) != f.addrLen() {
		return 0, false
	}
	ng, ok := exprAt[*expr.Numgen](ex, 1)
	if !ok || ng.Modulus != 1 || ng.Type != unix.NFT_NG_RANDOM {
		return 0, false
	}
	return ng.Offset, true
}

func stickyKeyText(f Family, id uint32) string {
	return fmt.Sprintf("%s saddr . numgen random mod 1 offset %d", f, id)
}

// nftDuration prints a duration as nft does: 10800s is "3h", 90s "1m30s".
func nftDuration(d time.Duration) string {
	ms := d.Milliseconds()
	if ms == 0 {
		return "0s"
	}
	var b strings.Builder
	for _, u := range []struct {
		ms   int64
		unit string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if n := ms / u.ms; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.unit)
			ms -= n * u.ms
		}
	}
	return b.String()
}

// stickyKeyType is the set's key type as nft encodes a concatenation:
// each part's type id shifted in 6 bits at a time (the address, then
// integer).
func stickyKeyType(f Family) uint32 {
	const integerType = 4
	_, addr := FieldSaddr.datatype(f)
	return addr<<6 | integerType
}

func stickyKeyLen(f Family) uint32 { return uint32(f.addrLen()) + 4 }

// stickyUserdata is what nft stores with the set so that `nft list` prints
// its `typeof ip saddr . numgen random mod 1` (without it nft prints a type
// it cannot parse back), then the comment.
func stickyUserdata(f Family, comment string) []byte {
	tlv := func(typ byte, v []byte) []byte { return append([]byte{typ, byte(len(v))}, v...) }
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	// nft's expression type ids and payload descriptions (its own
	// numbering, stored as userdata): concat 13, payload 7, numgen 23;
	// proto_ip 12 with saddr 11, proto_ip6 13 with saddr 8.
	desc, field := uint32(12), uint32(11)
	if f == IPv6 {
		desc, field = 13, 8
	}
	payload := cat(tlv(0, u32(7)), tlv(1, cat(tlv(0, u32(desc)), tlv(1, u32(field)))))
	numgen := cat(tlv(0, u32(23)), tlv(1, cat(tlv(0, u32(unix.NFT_NG_RANDOM)), tlv(1, u32(1)), tlv(2, u32(0)))))
	typeOf := cat(tlv(0, u32(13)), tlv(1, cat(tlv(0, payload), tlv(1, numgen))))
	const keyByteorder, keyTypeof, commentType = 0, 3, 7
	return cat(tlv(keyByteorder, u32(0)), tlv(keyTypeof, typeOf), userdataComment(commentType, comment))
}

// addStickySet creates the sticky set, or keeps it as it is when it
// exists: its elements are live state that no sync may flush.
func (b *batch) addStickySet(f Family, table, name, comment string, id uint32) {
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_SET_TABLE, table)
	b.str(unix.NFTA_SET_NAME, name)
	b.u32(unix.NFTA_SET_FLAGS, unix.NFT_SET_TIMEOUT|unix.NFT_SET_EVAL)
	b.u32(unix.NFTA_SET_KEY_TYPE, stickyKeyType(f))
	b.u32(unix.NFTA_SET_KEY_LEN, stickyKeyLen(f))
	b.u32(unix.NFTA_SET_ID, id)
	b.nest(unix.NFTA_SET_DESC)
	b.u32(unix.NFTA_SET_DESC_SIZE, stickySetSize)
	b.unnest()
	b.attr(unix.NFTA_SET_USERDATA, stickyUserdata(f, comment))
	b.end()
}

func (s *scriptWriter) addStickySet(f Family, table, name, _ string, _ uint32) {
	s.line("add set %s %s %s { typeof %s saddr . numgen random mod 1; size %d; flags dynamic,timeout; }",
		f, table, name, f, stickySetSize)
}

func (t *Table) renderStickySet(b *strings.Builder) {
	fmt.Fprintf(b, "\tset %s {\n", t.Sticky)
	fmt.Fprintf(b, "\t\ttypeof %s saddr . numgen random mod 1\n", t.Family)
	fmt.Fprintf(b, "\t\tsize %d\n", stickySetSize)
	b.WriteString("\t\tflags dynamic,timeout\n")
	fmt.Fprintf(b, "\t\tcomment %q\n", t.StickyComment)
	b.WriteString("\t}\n")
}
