package ipvs

import (
	"errors"
	"fmt"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// CleanupHelpers deletes kube-ipvs0 and both helper tables; removed is
// false when neither was there.
func CleanupHelpers(k *nftlib.Kernel, netnsPath string) (removed bool, err error) {
	dummy, derr := ipvsnl.DeleteDummy(netnsPath)
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
