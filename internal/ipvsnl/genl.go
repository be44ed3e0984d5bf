package ipvsnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// Generic netlink and IPVS attribute numbers (linux/genetlink.h,
// linux/ip_vs.h). Integers are host order except ports and the IPv4
// persistence netmask, which the kernel reads as big-endian.
const (
	genlIDCtrl         = 0x10 // GENL_ID_CTRL
	ctrlCmdGetFamily   = 3
	ctrlAttrFamilyID   = 1
	ctrlAttrFamilyName = 2
	genlHdrLen         = 4
	ipvsGenlVersion    = 1
	ipvsFamilyName     = "IPVS"

	attrCmdService = 1 // IPVS_CMD_ATTR_SERVICE
	attrCmdDest    = 2 // IPVS_CMD_ATTR_DEST

	svcAttrAF        = 1
	svcAttrProtocol  = 2
	svcAttrAddr      = 3
	svcAttrPort      = 4
	svcAttrFwmark    = 5
	svcAttrSchedName = 6
	svcAttrFlags     = 7
	svcAttrTimeout   = 8
	svcAttrNetmask   = 9

	destAttrAddr        = 1
	destAttrPort        = 2
	destAttrFwdMethod   = 3
	destAttrWeight      = 4
	destAttrUThresh     = 5
	destAttrLThresh     = 6
	destAttrActiveConns = 7
	destAttrInactConns  = 8
	destAttrAddrFamily  = 11

	nlHdrLen = nlmsg.HdrLen
)

// attrs builds netlink attributes.
type attrs = nlmsg.Attrs

// appendMessage appends one generic netlink request to b.
func appendMessage(b []byte, family, flags uint16, seq uint32, cmd uint8, version uint8, a attrs) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(nlHdrLen+genlHdrLen+len(a)))
	b = binary.NativeEndian.AppendUint16(b, family)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST|flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, cmd, version, 0, 0)
	return append(b, a...)
}

// netmaskBytes: the kernel takes the attribute as a __be32 but uses it as
// a prefix length for IPv6, so it is the integer in host order; for IPv4
// it is a mask in network order. 0xffffffff and 128 are what we use.
func netmaskBytes(s Service) []byte {
	if s.Addr.Is4() {
		return binary.BigEndian.AppendUint32(nil, s.Netmask)
	}
	return binary.NativeEndian.AppendUint32(nil, s.Netmask)
}

// serviceAttrs are the key of a service and, when full, its settings
// (NEW_SERVICE and SET_SERVICE need them all).
func serviceAttrs(a *attrs, s Service, full bool) {
	a.Nest(attrCmdService, func(a *attrs) {
		a.U16(svcAttrAF, family(s.Addr))
		a.U16(svcAttrProtocol, protoNumber(s.Protocol))
		a.Put(svcAttrAddr, s.Addr.AsSlice()...)
		a.BE16(svcAttrPort, s.Port)
		if !full {
			return
		}
		a.Put(svcAttrSchedName, append([]byte(s.Scheduler), 0)...)
		// ip_vs_flags{flags, mask}: mask all bits, so the kernel takes ours.
		a.Put(svcAttrFlags, binary.NativeEndian.AppendUint32(binary.NativeEndian.AppendUint32(nil, s.Flags), ^uint32(0))...)
		a.U32(svcAttrTimeout, s.Timeout)
		a.Put(svcAttrNetmask, netmaskBytes(s)...)
	})
}

// destAttrs are the key of a real server and, when full, its settings.
func destAttrs(a *attrs, d Dest, full bool) {
	a.Nest(attrCmdDest, func(a *attrs) {
		a.Put(destAttrAddr, d.Addr.Addr().AsSlice()...)
		a.BE16(destAttrPort, d.Addr.Port())
		if full {
			a.U32(destAttrFwdMethod, d.Fwd&FwdMask)
			a.U32(destAttrWeight, d.Weight)
			a.U32(destAttrUThresh, 0)
			a.U32(destAttrLThresh, 0)
		}
		a.U16(destAttrAddrFamily, family(d.Addr.Addr()))
	})
}

// appendOp appends op as one message.
func appendOp(b []byte, family, flags uint16, seq uint32, op Op) []byte {
	var a attrs
	switch op.Cmd {
	case CmdNewService, CmdSetService:
		serviceAttrs(&a, op.Service, true)
	case CmdDelService:
		serviceAttrs(&a, op.Service, false)
	case CmdNewDest, CmdSetDest, CmdDelDest:
		serviceAttrs(&a, op.Service, false)
		destAttrs(&a, op.Dest, op.Cmd != CmdDelDest)
	}
	return appendMessage(b, family, flags, seq, uint8(op.Cmd), ipvsGenlVersion, a)
}

// appendDump appends a dump request: every service, or one service's dests.
func appendDump(b []byte, family uint16, seq uint32, svc *Service) []byte {
	var a attrs
	cmd := cmdGetService
	if svc != nil {
		cmd = cmdGetDest
		serviceAttrs(&a, *svc, false)
	}
	return appendMessage(b, family, unix.NLM_F_DUMP, seq, uint8(cmd), ipvsGenlVersion, a)
}

// appendFamilyRequest asks the generic netlink controller for a family's id.
// It asks for an ack too: the reply alone does not end the exchange for
// roundTrip, which waits for an ack or an error (the kernel sends an ack
// after a successful request only when asked).
func appendFamilyRequest(b []byte, seq uint32, name string) []byte {
	var a attrs
	a.Put(ctrlAttrFamilyName, append([]byte(name), 0)...)
	return appendMessage(b, genlIDCtrl, unix.NLM_F_ACK, seq, ctrlCmdGetFamily, 1, a)
}

// parseFamilyID reads the id out of the controller's answer (the genl
// payload after the netlink header).
func parseFamilyID(payload []byte) (uint16, error) {
	if len(payload) < genlHdrLen {
		return 0, fmt.Errorf("short generic netlink controller reply")
	}
	var id uint16
	nlmsg.Walk(payload[genlHdrLen:], func(typ uint16, data []byte) {
		if typ == ctrlAttrFamilyID && len(data) >= 2 {
			id = binary.NativeEndian.Uint16(data)
		}
	})
	if id == 0 {
		return 0, fmt.Errorf("generic netlink controller reply without a family id")
	}
	return id, nil
}

// parseService decodes one service of a GET_SERVICE dump (the genl
// payload after the netlink header). ok is false for services we never
// create and leave alone: firewall marks, protocols other than ours.
func parseService(payload []byte) (s Service, ok bool) {
	if len(payload) < genlHdrLen {
		return s, false
	}
	var af, proto uint16
	var raw, mask []byte
	var fwmark bool
	nlmsg.Walk(payload[genlHdrLen:], func(typ uint16, data []byte) {
		if typ != attrCmdService {
			return
		}
		nlmsg.Walk(data, func(typ uint16, data []byte) {
			switch {
			case typ == svcAttrAF && len(data) >= 2:
				af = binary.NativeEndian.Uint16(data)
			case typ == svcAttrProtocol && len(data) >= 2:
				proto = binary.NativeEndian.Uint16(data)
			case typ == svcAttrAddr:
				raw = data
			case typ == svcAttrPort && len(data) >= 2:
				s.Port = binary.BigEndian.Uint16(data)
			case typ == svcAttrFwmark && len(data) >= 4:
				fwmark = binary.NativeEndian.Uint32(data) != 0
			case typ == svcAttrSchedName:
				s.Scheduler = cString(data)
			case typ == svcAttrFlags && len(data) >= 4:
				s.Flags = binary.NativeEndian.Uint32(data) &^ flagHashed
			case typ == svcAttrTimeout && len(data) >= 4:
				s.Timeout = binary.NativeEndian.Uint32(data)
			case typ == svcAttrNetmask && len(data) >= 4:
				mask = data
			}
		})
	})
	s.Addr, ok = addrOf(af, raw)
	if mask != nil {
		s.Netmask = binary.NativeEndian.Uint32(mask)
		if af == unix.AF_INET {
			s.Netmask = binary.BigEndian.Uint32(mask)
		}
	}
	var known bool
	s.Protocol, known = protocolOf(proto)
	return s, ok && known && !fwmark
}

// parseDest decodes one real server of a GET_DEST dump; family is the
// service's, for kernels that send no address family of their own.
func parseDest(payload []byte, svcFamily uint16) (d Dest, ok bool) {
	if len(payload) < genlHdrLen {
		return d, false
	}
	af := svcFamily
	var raw []byte
	var port uint16
	nlmsg.Walk(payload[genlHdrLen:], func(typ uint16, data []byte) {
		if typ != attrCmdDest {
			return
		}
		nlmsg.Walk(data, func(typ uint16, data []byte) {
			switch {
			case typ == destAttrAddr:
				raw = data
			case typ == destAttrPort && len(data) >= 2:
				port = binary.BigEndian.Uint16(data)
			case typ == destAttrFwdMethod && len(data) >= 4:
				d.Fwd = binary.NativeEndian.Uint32(data) & FwdMask
			case typ == destAttrWeight && len(data) >= 4:
				d.Weight = binary.NativeEndian.Uint32(data)
			case typ == destAttrActiveConns && len(data) >= 4:
				d.Active = binary.NativeEndian.Uint32(data)
			case typ == destAttrInactConns && len(data) >= 4:
				d.Inactive = binary.NativeEndian.Uint32(data)
			case typ == destAttrAddrFamily && len(data) >= 2:
				af = binary.NativeEndian.Uint16(data)
			}
		})
	})
	a, ok := addrOf(af, raw)
	d.Addr = netip.AddrPortFrom(a, port)
	return d, ok
}

// addrOf reads an address attribute: the kernel sends all 16 bytes of
// union nf_inet_addr, the family says how many count.
func addrOf(af uint16, raw []byte) (netip.Addr, bool) {
	switch {
	case af == unix.AF_INET && len(raw) >= 4:
		return netip.AddrFrom4([4]byte(raw[:4])), true
	case af == unix.AF_INET6 && len(raw) >= 16:
		return netip.AddrFrom16([16]byte(raw[:16])), true
	}
	return netip.Addr{}, false
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
