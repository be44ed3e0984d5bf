package ipvs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// DeleteDummy deletes kube-ipvs0 (and with it its addresses) in the
// current network namespace or the one at netnsPath; removed is false when
// there was no such link (a kernel without dummy links has none).
func DeleteDummy(netnsPath string) (removed bool, err error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_ROUTE)
	if err != nil {
		return false, err
	}
	d := &Dummy{fd: fd, buf: make([]byte, 1<<16)}
	defer d.Close()
	err = d.exchange(delLinkMessage(DummyName, d.nextSeq()), nil)
	if errors.Is(err, unix.ENODEV) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("deleting %s: %w", DummyName, err)
	}
	return true, nil
}

func delLinkMessage(name string, seq uint32) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, rtattr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	return nlMessage(unix.RTM_DELLINK, unix.NLM_F_ACK, seq, body)
}

// CleanupHelpers deletes kube-ipvs0 and both helper tables; removed is
// false when neither was there.
func CleanupHelpers(k *nftlib.Kernel, netnsPath string) (removed bool, err error) {
	dummy, derr := DeleteDummy(netnsPath)
	tables, terr := k.DeleteSetTables(HelperTables(proxier.DefaultSettings(), proxier.Node{}, nil)...)
	if terr != nil {
		terr = fmt.Errorf("deleting the IPVS helper tables: %w", terr)
	}
	return dummy || tables, errors.Join(derr, terr)
}
