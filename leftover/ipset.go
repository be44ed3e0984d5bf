package leftover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// ipset's netlink interface (linux/netfilter/ipset/ip_set.h).
const (
	ipsetCmdDestroy   = 3    // IPSET_CMD_DESTROY
	ipsetAttrProtocol = 1    // IPSET_ATTR_PROTOCOL
	ipsetAttrSetName  = 2    // IPSET_ATTR_SETNAME
	ipsetProtocolMin  = 6    // IPSET_PROTOCOL_MIN: every kernel since 3.x takes it
	ipsetErrBusy      = 4100 // IPSET_ERR_BUSY: a rule still uses the set
	ipsetMaxName      = 31
	nfgenLen          = 4 // struct nfgenmsg, after the netlink header
)

// ipsetNames are kube-proxy's ipvs mode's ipsets of both families: the IPv6
// ones have KUBE-6- for KUBE-, cut to ipset's 31 characters as upstream
// does.
func ipsetNames() []string {
	out := append([]string(nil), ipsets...)
	for _, n := range ipsets {
		v6 := strings.Replace(n, "KUBE-", "KUBE-6-", 1)
		out = append(out, v6[:min(len(v6), ipsetMaxName)])
	}
	return out
}

// destroyMessage is an IPSET_CMD_DESTROY of set name.
func destroyMessage(name string, seq uint32) []byte {
	var a nlmsg.Attrs
	a.Put(ipsetAttrProtocol, ipsetProtocolMin)
	a.Put(ipsetAttrSetName, append([]byte(name), 0)...)
	b := make([]byte, nlmsg.HdrLen+nfgenLen, nlmsg.HdrLen+nfgenLen+len(a))
	binary.NativeEndian.PutUint16(b[4:], unix.NFNL_SUBSYS_IPSET<<8|ipsetCmdDestroy)
	// NLM_F_EXCL: a missing set is ENOENT, not silently nothing.
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b[nlmsg.HdrLen] = unix.NFPROTO_IPV4
	b[nlmsg.HdrLen+1] = unix.NFNETLINK_V0
	b = append(b, a...)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

// destroyIPSets destroys kube-proxy's ipsets in the network namespace at
// netnsPath, each on its own (one in use stays, the others go). It returns
// those destroyed and those still used by a rule (iptables-legacy's, which
// nothing here can remove). A kernel without ipset has none.
func destroyIPSets(netnsPath string, names []string) (destroyed, busy []string, err error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 1<<16)
	var errs []error
	for i, name := range names {
		seq := uint32(i + 1)
		if err := nlmsg.Send(fd, destroyMessage(name, seq)); err != nil {
			return destroyed, busy, fmt.Errorf("destroying ipset %s: %w", name, err)
		}
		var errno syscall.Errno
		for acked := false; !acked; {
			err := nlmsg.Receive(fd, buf, func(typ uint16, s uint32, p []byte) {
				if typ == unix.NLMSG_ERROR && s == seq {
					errno, acked = nlmsg.Errno(p), true
				}
			})
			if err != nil {
				return destroyed, busy, fmt.Errorf("destroying ipset %s: %w", name, err)
			}
		}
		switch {
		case errno == 0:
			destroyed = append(destroyed, name)
		case errno == unix.ENOENT:
		case errno == ipsetErrBusy:
			busy = append(busy, name)
		case i == 0 && (errno == unix.EOPNOTSUPP || errno == unix.EPROTONOSUPPORT || errno == unix.EINVAL):
			return nil, nil, nil // no ipset in this kernel
		default:
			errs = append(errs, fmt.Errorf("destroying ipset %s: %w", name, errno))
		}
	}
	return destroyed, busy, errors.Join(errs...)
}
