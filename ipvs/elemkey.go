package ipvs

import (
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
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
var keyProtocols = [...]proxier.Protocol{"", proxier.TCP, proxier.UDP, proxier.SCTP}

func protocolIndex(p proxier.Protocol) uint8 {
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
