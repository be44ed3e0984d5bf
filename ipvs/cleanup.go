package ipvs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
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
	tables, terr := deleteHelperTables(k)
	if terr != nil {
		terr = fmt.Errorf("deleting the IPVS helper tables: %w", terr)
	}
	return dummy || tables, errors.Join(derr, terr)
}

// deleteHelperTables deletes those of the helper tables that the kernel
// has, in one transaction; removed is false when none was there.
func deleteHelperTables(k *nftlib.Kernel) (removed bool, err error) {
	tx := k.NewTx()
	for _, f := range []nftlib.Family{nftlib.IPv4, nftlib.IPv6} {
		has, err := k.HasTables(f, []string{HelperTableName})
		if err != nil {
			k.DiscardTx(tx)
			return false, err
		}
		if has[HelperTableName] {
			tx.DelTable(f, HelperTableName)
		}
	}
	if tx.Messages() == 0 {
		k.DiscardTx(tx)
		return false, nil
	}
	if err := k.CommitTx(tx); err != nil {
		return false, err
	}
	return true, nil
}
