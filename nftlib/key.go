package nftlib

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// nftSetConcat is NFT_SET_CONCAT: an interval set of concatenations
// (the kernel's pipapo set), which golang.org/x/sys/unix does not define.
const nftSetConcat = 0x80

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END: the inclusive end of a
// concatenated range.
const nftaSetElemKeyEnd = 10

// NFTA_SET_DESC_CONCAT and NFTA_SET_FIELD_LEN: a concatenation's field lengths.
const (
	nftaSetDescConcat = 2
	nftaSetFieldLen   = 1
)

// flags are the map's NFTA_SET_FLAGS.
func (m *Map) flags() uint32 {
	switch {
	case !m.Plain:
		return unix.NFT_SET_MAP
	case m.Interval:
		return unix.NFT_SET_INTERVAL | nftSetConcat
	}
	return 0
}

// concatDesc tells the kernel each field's length, which its pipapo set
// needs.
func (b *batch) concatDesc(f Family, key []Field) {
	b.nest(unix.NFTA_SET_DESC)
	b.nest(nftaSetDescConcat)
	for _, fl := range key {
		b.nest(unix.NFTA_LIST_ELEM)
		b.u32(nftaSetFieldLen, fl.size(f))
		b.unnest()
	}
	b.unnest()
	b.unnest()
}

// keyLen is the key's length as nft declares it: a single field as it is,
// a concatenation with each field padded to 4 bytes.
func keyLen(f Family, key []Field) uint32 {
	if len(key) == 1 {
		return key[0].size(f)
	}
	var n uint32
	for _, fl := range key {
		n += (fl.size(f) + 3) &^ 3
	}
	return n
}

// encodeKey lays out a key as nft does: each field in network byte order,
// padded to a multiple of 4 bytes in a concatenation.
func encodeKey(f Family, key []Field, k Key) []byte {
	return appendKey(make([]byte, 0, 40), f, key, k, false)
}

// appendKey appends the encoded key; with end, the key's inclusive end in
// an interval set (the last address of Net).
func appendKey(out []byte, f Family, key []Field, k Key, end bool) []byte {
	addrs := 0
	for _, fl := range key {
		start := len(out)
		switch fl {
		case FieldSaddr, FieldDaddr:
			out = append(out, k.addr(addrs, end).AsSlice()...)
			addrs++
		case FieldL4Proto:
			out = append(out, k.Proto)
		case FieldDport:
			out = binary.BigEndian.AppendUint16(out, k.Port)
		}
		for len(key) > 1 && (len(out)-start)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out
}

// addr is the key's i-th address field: Addr, then Net (its first
// address, or with end its last).
func (k Key) addr(i int, end bool) netip.Addr {
	switch {
	case i == 0:
		return k.Addr
	case end:
		return lastAddr(k.Net)
	}
	return k.Net.Masked().Addr()
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// elementID identifies an element of m among the kernel's: its encoded
// key, and in an interval set its end.
func (m *Map) elementID(f Family, k Key) string {
	id := encodeKey(f, m.Key, k)
	if m.Interval {
		id = appendKey(id, f, m.Key, k, true)
	}
	return string(id)
}

// decodeKey turns an encoded key (and, in an interval set, its end) back
// into a Key.
func (m *Map) decodeKey(f Family, key, end []byte) (Key, error) {
	var k Key
	if len(key) != int(keyLen(f, m.Key)) || (m.Interval && len(end) != len(key)) {
		return k, fmt.Errorf("element key of %d bytes (end %d), want %d", len(key), len(end), keyLen(f, m.Key))
	}
	off, addrs := 0, 0
	for _, fl := range m.Key {
		n := int(fl.size(f))
		v := key[off : off+n]
		switch fl {
		case FieldSaddr, FieldDaddr:
			a, _ := netip.AddrFromSlice(v)
			if addrs++; addrs == 1 {
				k.Addr = a
				break
			}
			k.Net = netip.PrefixFrom(a, a.BitLen())
			if m.Interval {
				hi, _ := netip.AddrFromSlice(end[off : off+n])
				p, ok := prefixOfRange(a, hi)
				if !ok {
					return k, fmt.Errorf("range %s-%s is no prefix", a, hi)
				}
				k.Net = p
			}
		case FieldL4Proto:
			k.Proto = v[0]
		case FieldDport:
			k.Port = binary.BigEndian.Uint16(v)
		}
		off += n
		if len(m.Key) > 1 {
			off = (off + 3) &^ 3
		}
	}
	return k, nil
}

func prefixOfRange(lo, hi netip.Addr) (netip.Prefix, bool) {
	for bits := lo.BitLen(); bits >= 0; bits-- {
		p := netip.PrefixFrom(lo, bits)
		if p.Masked().Addr() == lo && lastAddr(p) == hi {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// keyText is the key as nft prints it.
func (k Key) text(key []Field) string {
	parts := make([]string, 0, len(key))
	addrs := 0
	for _, fl := range key {
		switch fl {
		case FieldSaddr, FieldDaddr:
			if addrs++; addrs == 1 {
				parts = append(parts, k.Addr.String())
			} else if k.Net.IsSingleIP() {
				parts = append(parts, k.Net.Addr().String())
			} else {
				parts = append(parts, k.Net.Masked().String())
			}
		case FieldL4Proto:
			parts = append(parts, ProtoName(k.Proto))
		case FieldDport:
			parts = append(parts, strconv.Itoa(int(k.Port)))
		}
	}
	return strings.Join(parts, " . ")
}

// perLine is how many elements of a set nft prints on one line: by the
// key's width.
func perLine(f Family, key []Field) int {
	switch {
	case len(key) > 1:
		return 1
	case key[0].size(f) <= 2:
		return 5
	case key[0].size(f) <= 4:
		return 2
	}
	return 1
}
