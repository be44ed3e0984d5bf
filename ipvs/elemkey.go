package ipvs

import (
	"net/netip"
	"slices"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// elemKey is an Element packed into 56 bytes instead of 128 (no string
// headers, no address zones): the Syncer keeps one per helper set element
// it wants or holds, a hundred thousand at 10k Services with local
// endpoints (one KUBE-LOOP-BACK element each).
type elemKey struct {
	addr, addr2, net [16]byte
	port             uint16
	set              uint8 // index in Sets
	proto            uint8 // index in keyProtocols
	bits             uint8 // net's prefix length
	flags            uint8
}

// elemKey flags: which addresses are set and which are IPv4.
const (
	keyV6 uint8 = 1 << iota // the element is the ip6 table's
	keyAddr
	keyAddr4
	keyAddr2
	keyAddr24
	keyNet
	keyNet4
)

// keyProtocols are the protocols an element can carry (none, or a
// service port's).
var keyProtocols = [...]model.Protocol{"", model.TCP, model.UDP, model.SCTP}

func protocolIndex(p model.Protocol) uint8 {
	for i, q := range keyProtocols {
		if p == q {
			return uint8(i)
		}
	}
	return 0
}

// packAddr stores a in to and returns its flags (valid, IPv4).
func packAddr(a netip.Addr, to *[16]byte, valid, is4 uint8) uint8 {
	if !a.IsValid() {
		return 0
	}
	*to = a.As16()
	if a.Is4() {
		return valid | is4
	}
	return valid
}

func unpackAddr(b [16]byte, flags, valid, is4 uint8) netip.Addr {
	switch {
	case flags&valid == 0:
		return netip.Addr{}
	case flags&is4 != 0:
		return netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrFrom16(b)
}

// key packs e. Every Element of a plan or of the helper tables packs
// and unpacks to itself: their protocols are keyProtocols, their sets
// are Sets and their addresses carry no zone.
func (e Element) key() elemKey {
	k := elemKey{port: e.Port, set: uint8(setIndex(e.Set)), proto: protocolIndex(e.Protocol), bits: uint8(max(e.Net.Bits(), 0))}
	if e.V6 {
		k.flags |= keyV6
	}
	k.flags |= packAddr(e.Addr, &k.addr, keyAddr, keyAddr4)
	k.flags |= packAddr(e.Addr2, &k.addr2, keyAddr2, keyAddr24)
	if e.Net.IsValid() {
		k.flags |= packAddr(e.Net.Addr(), &k.net, keyNet, keyNet4)
	}
	return k
}

// element unpacks k.
func (k elemKey) element() Element {
	e := Element{V6: k.flags&keyV6 != 0, Port: k.port, Protocol: keyProtocols[k.proto],
		Addr: unpackAddr(k.addr, k.flags, keyAddr, keyAddr4), Addr2: unpackAddr(k.addr2, k.flags, keyAddr2, keyAddr24)}
	if int(k.set) < len(Sets) {
		e.Set = Sets[k.set].Name
	}
	if k.flags&keyNet != 0 {
		e.Net = netip.PrefixFrom(unpackAddr(k.net, k.flags, keyNet, keyNet4), int(k.bits))
	}
	return e
}

// elemKey4 is an Element whose addresses are all IPv4 (or absent), packed
// into 18 bytes: most elements of an IPv4 cluster, so that the Syncer's
// map and the fragments hold a third of what elemKey would.
type elemKey4 struct {
	addr, addr2, net [4]byte
	port             uint16
	set              uint8
	proto            uint8
	bits             uint8
	flags            uint8 // keyV6, keyAddr, keyAddr2, keyNet
}

// key4 packs e when its addresses are IPv4 ones (ok false otherwise).
func (e Element) key4() (k elemKey4, ok bool) {
	pack := func(a netip.Addr, to *[4]byte, valid uint8) bool {
		if !a.IsValid() {
			return true
		}
		if !a.Is4() {
			return false
		}
		*to = a.As4()
		k.flags |= valid
		return true
	}
	if !pack(e.Addr, &k.addr, keyAddr) || !pack(e.Addr2, &k.addr2, keyAddr2) ||
		(e.Net.IsValid() && !pack(e.Net.Addr(), &k.net, keyNet)) {
		return elemKey4{}, false
	}
	k.port, k.set, k.proto, k.bits = e.Port, uint8(setIndex(e.Set)), protocolIndex(e.Protocol), uint8(max(e.Net.Bits(), 0))
	if e.V6 {
		k.flags |= keyV6
	}
	return k, true
}

// element unpacks k.
func (k elemKey4) element() Element {
	addr := func(b [4]byte, valid uint8) netip.Addr {
		if k.flags&valid == 0 {
			return netip.Addr{}
		}
		return netip.AddrFrom4(b)
	}
	e := Element{V6: k.flags&keyV6 != 0, Port: k.port, Protocol: keyProtocols[k.proto],
		Addr: addr(k.addr, keyAddr), Addr2: addr(k.addr2, keyAddr2)}
	if int(k.set) < len(Sets) {
		e.Set = Sets[k.set].Name
	}
	if k.flags&keyNet != 0 {
		e.Net = netip.PrefixFrom(addr(k.net, keyNet), int(k.bits))
	}
	return e
}

// packedElems are a fragment's elements: the IPv4 ones small, the others
// whole, each list in compareElements order.
type packedElems struct {
	v4    []elemKey4
	other []elemKey
}

// packElements packs elems, each list made at its size.
func packElements(elems []Element) packedElems {
	n4 := 0
	for _, e := range elems {
		if _, ok := e.key4(); ok {
			n4++
		}
	}
	p := packedElems{v4: make([]elemKey4, 0, n4)}
	if n4 < len(elems) {
		p.other = make([]elemKey, 0, len(elems)-n4)
	}
	for _, e := range elems {
		if k, ok := e.key4(); ok {
			p.v4 = append(p.v4, k)
		} else {
			p.other = append(p.other, e.key())
		}
	}
	return p
}

func (p packedElems) equal(o packedElems) bool {
	return slices.Equal(p.v4, o.v4) && slices.Equal(p.other, o.other)
}

// all unpacks every element, sorted.
func (p packedElems) all() []Element {
	out := make([]Element, 0, len(p.v4)+len(p.other))
	for _, k := range p.v4 {
		out = append(out, k.element())
	}
	for _, k := range p.other {
		out = append(out, k.element())
	}
	slices.SortFunc(out, compareElements)
	return out
}
