package nftlib

import "fmt"

// DeleteSetTables deletes those of the tables (by family and name) that the
// kernel has, in one transaction; removed is false when none was there.
func (k *Kernel) DeleteSetTables(tables ...*SetTable) (removed bool, err error) {
	b := k.startBatch()
	for _, t := range tables {
		kts, err := k.ReadFamily(t.Family, []string{t.Name}, nil)
		if err != nil {
			return false, err
		}
		if kts[t.Name].Exists {
			b.DelTable(t.Family, t.Name)
		}
	}
	if b.Messages() == 0 {
		return false, nil
	}
	err = k.commit(b)
	k.finished(b)
	if err != nil {
		return false, fmt.Errorf("deleting tables: %w", err)
	}
	return true, nil
}
