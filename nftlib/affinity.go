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

// Session affinity (sessionAffinity: ClientIP) uses one dynamic set per
// table, `affinity`, keyed by the client's address and a 32-bit id of the
// endpoint (of one service port). KUBE-SVC looks the pair up for each
// endpoint before choosing at random; KUBE-SEP adds or refreshes it. One set
// per table keeps a full sync linear in the number of Services: the kernel
// looks sets up by walking a list, so a set per endpoint (upstream's
// nftables mode) or per Service makes a sync quadratic.
//
// nft (1.0.6 and later) parses a constant inside such a concatenation only
// as an expression it can type, so the id is written as
// `numgen random mod 1 offset ID`, which always yields ID.
const (
	SetAffinity = "affinity"
	// affinitySetSize bounds the set: a client that finds it full gets no
	// affinity (its connection still goes through, at random).
	affinitySetSize = 1 << 20
	affinityComment = "sessionAffinity ClientIP: client . endpoint id"
)

// AffinityID is the id of an endpoint chain in the affinity set: the first
// four bytes of a hash of its name, so stable across restarts and without
// state. Two endpoints of one service port sharing an id would only make a
// client stick to another valid endpoint of that port.
func AffinityID(sepChain string) uint32 {
	sum := sha256.Sum256([]byte(sepChain))
	return binary.BigEndian.Uint32(sum[:4])
}

// affinityKey loads `ip saddr . numgen random mod 1 offset ID` into
// registers, as nft lays the concatenation out: the address from register 1
// on, the id in the next 32-bit register.
func affinityKey(f Family, id uint32) []expr.Any {
	idReg := uint32(unix.NFT_REG32_01) // after the 4-byte IPv4 address
	if f == IPv6 {
		idReg = unix.NFT_REG_2 // after the 16-byte IPv6 address
	}
	return []expr.Any{
		FieldSaddr.load(f, unix.NFT_REG_1),
		&expr.Numgen{Register: idReg, Modulus: 1, Type: unix.NFT_NG_RANDOM, Offset: id},
	}
}

// affinityKeyAt reads affinityKey's expressions at the start of ex: the
// source address, then the endpoint id.
func affinityKeyAt(f Family, ex []expr.Any) (id uint32, ok bool) {
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

func affinityKeyText(f Family, id uint32) string {
	return fmt.Sprintf("%s saddr . numgen random mod 1 offset %d", f, id)
}

// NftDuration prints a duration as nft does: 10800s is "3h", 90s "1m30s".
func NftDuration(d time.Duration) string {
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

// affinityKeyType is the set's key type as nft encodes a concatenation:
// each part's type id shifted in 6 bits at a time (the address, then
// integer).
func affinityKeyType(f Family) uint32 {
	const integerType = 4
	_, addr := FieldSaddr.datatype(f)
	return addr<<6 | integerType
}

func affinityKeyLen(f Family) uint32 { return uint32(f.addrLen()) + 4 }

// affinityUserdata is what nft stores with the set so that `nft list` prints
// its `typeof ip saddr . numgen random mod 1` (without it nft prints a type
// it cannot parse back), then the comment.
func affinityUserdata(f Family) []byte {
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
	const keyByteorder, keyTypeof, comment = 0, 3, 7
	return cat(tlv(keyByteorder, u32(0)), tlv(keyTypeof, typeOf), userdataComment(comment, affinityComment))
}

// addAffinitySet creates the affinity set, or keeps it as it is when it
// exists: its elements are live state that no sync may flush.
func (b *Batch) addAffinitySet(f Family, table string, id uint32) {
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_SET_TABLE, table)
	b.str(unix.NFTA_SET_NAME, SetAffinity)
	b.u32(unix.NFTA_SET_FLAGS, unix.NFT_SET_TIMEOUT|unix.NFT_SET_EVAL)
	b.u32(unix.NFTA_SET_KEY_TYPE, affinityKeyType(f))
	b.u32(unix.NFTA_SET_KEY_LEN, affinityKeyLen(f))
	b.u32(unix.NFTA_SET_ID, id)
	b.nest(unix.NFTA_SET_DESC)
	b.u32(unix.NFTA_SET_DESC_SIZE, affinitySetSize)
	b.unnest()
	b.attr(unix.NFTA_SET_USERDATA, affinityUserdata(f))
	b.end()
}

func (s *scriptWriter) addAffinitySet(f Family, table string, _ uint32) {
	s.line("add set %s %s %s { typeof %s saddr . numgen random mod 1; size %d; flags dynamic,timeout; }",
		f, table, SetAffinity, f, affinitySetSize)
}

func (t *Table) renderAffinitySet(b *strings.Builder) {
	fmt.Fprintf(b, "\tset %s {\n", SetAffinity)
	fmt.Fprintf(b, "\t\ttypeof %s saddr . numgen random mod 1\n", t.Family)
	fmt.Fprintf(b, "\t\tsize %d\n", affinitySetSize)
	b.WriteString("\t\tflags dynamic,timeout\n")
	fmt.Fprintf(b, "\t\tcomment %q\n", affinityComment)
	b.WriteString("\t}\n")
}
