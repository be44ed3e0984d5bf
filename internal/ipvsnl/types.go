package ipvsnl

import (
	"cmp"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Service flags (IP_VS_SVC_F_* in linux/ip_vs.h).
const (
	FlagPersistent = 0x0001
	// flagHashed is set by the kernel on every service it holds; it is
	// not ours to compare or set.
	flagHashed = 0x0002
	// FlagSched2 is the scheduler's second flag: "mh-port" for mh (hash
	// the source port too), which upstream sets for mh as its
	// FlagSourceHash.
	FlagSched2 = 0x0010
)

// Forwarding methods (IP_VS_CONN_F_* & IP_VS_CONN_F_FWD_MASK).
const (
	FwdMasq   uint32 = 0
	FwdTunnel uint32 = 2
	FwdRoute  uint32 = 3
	FwdMask   uint32 = 7 // the method's bits of Dest.Fwd
)

// The kernel keeps weights and timeouts (seconds) as ints: larger values
// are refused (weights) or must be clamped (timeouts).
const (
	maxWeight  = 1<<31 - 1
	MaxTimeout = 1<<31 - 1
)

// ServiceKey identifies a virtual server: the kernel looks services up by
// protocol, address and port (we never create firewall-mark services).
type ServiceKey struct {
	Addr     netip.Addr
	Protocol model.Protocol
	Port     uint16
}

func (k ServiceKey) String() string {
	return k.Protocol.Lower() + "/" + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Compare orders keys by family, address, protocol and port.
func (k ServiceKey) Compare(o ServiceKey) int {
	if c := cmp.Compare(k.Addr.BitLen(), o.Addr.BitLen()); c != 0 {
		return c
	}
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Protocol, o.Protocol); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

// Service is one IPVS virtual server's settings.
type Service struct {
	ServiceKey
	Scheduler string
	Flags     uint32 // without the kernel's hashed bit
	Timeout   uint32 // persistence, seconds
	// Netmask groups persistent clients: a mask for IPv4 (0xffffffff:
	// per client address), a prefix length for IPv6 (128).
	Netmask uint32
}

// SameSettings reports whether two services need no SET_SERVICE between them.
func (s Service) SameSettings(o Service) bool {
	return s.Scheduler == o.Scheduler && s.Flags == o.Flags && s.Timeout == o.Timeout && s.Netmask == o.Netmask
}

// DestKey identifies a real server within its virtual server.
type DestKey = netip.AddrPort

// Dest is one IPVS real server.
type Dest struct {
	Addr   netip.AddrPort
	Weight uint32
	Fwd    uint32 // FwdMasq for everything we create
	// Connection counts, as the kernel reports them (ignored when applying).
	Active, Inactive uint32
}

// VirtualServer is a service and its real servers, ordered by address.
type VirtualServer struct {
	Service
	Dests []Dest
}

// family is the address family of an address as the kernel numbers it.
func family(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// protoNumber is p's IP protocol number, as IPVS attributes carry it.
func protoNumber(p model.Protocol) uint16 { return uint16(p.Number()) }

// protocolOf maps a kernel protocol number back; ok is false for the
// protocols IPVS knows but we never program (AH, ESP).
func protocolOf(n uint16) (model.Protocol, bool) {
	switch n {
	case unix.IPPROTO_TCP:
		return model.TCP, true
	case unix.IPPROTO_UDP:
		return model.UDP, true
	case unix.IPPROTO_SCTP:
		return model.SCTP, true
	}
	return "", false
}

// Cmd is an IPVS generic netlink command (IPVS_CMD_* in linux/ip_vs.h).
type Cmd uint8

// The commands Apply sends (the dumps Read and Dests send are ours).
const (
	CmdNewService Cmd = 1
	CmdSetService Cmd = 2
	CmdDelService Cmd = 3
	cmdGetService Cmd = 4
	CmdNewDest    Cmd = 5
	CmdSetDest    Cmd = 6
	CmdDelDest    Cmd = 7
	cmdGetDest    Cmd = 8
)

func (c Cmd) String() string {
	switch c {
	case CmdNewService:
		return "new-service"
	case CmdSetService:
		return "set-service"
	case CmdDelService:
		return "del-service"
	case CmdNewDest:
		return "new-dest"
	case CmdSetDest:
		return "set-dest"
	case CmdDelDest:
		return "del-dest"
	}
	return fmt.Sprintf("cmd-%d", uint8(c))
}

// Op is one IPVS command: a service command, or a dest command on Service.
type Op struct {
	Cmd     Cmd
	Service Service
	Dest    Dest
}

func (o Op) String() string {
	if o.Cmd == CmdDelDest {
		return fmt.Sprintf("%s %s -> %s", o.Cmd, o.Service.ServiceKey, o.Dest.Addr)
	}
	if o.Cmd >= CmdNewDest {
		return fmt.Sprintf("%s %s -> %s w%d", o.Cmd, o.Service.ServiceKey, o.Dest.Addr, o.Dest.Weight)
	}
	return fmt.Sprintf("%s %s", o.Cmd, o.Service.ServiceKey)
}
