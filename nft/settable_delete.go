package nft

import "fmt"

// DeleteSetTables deletes those of the tables (by family and name) that the
// kernel has, in one transaction; removed is false when none was there.
func (k *Kernel) DeleteSetTables(tables ...*SetTable) (removed bool, err error) {
	b := k.newBatch()
	for _, t := range tables {
		kts, err := k.readFamily(t.Family, []string{t.Name}, nil)
		if err != nil {
			return false, err
		}
		if kts[t.Name].exists {
			b.delTable(t.Family, t.Name)
		}
	}
	if b.messages() == 0 {
		return false, nil
	}
	err = k.Apply(b)
	k.finished(b)
	if err != nil {
		return false, fmt.Errorf("deleting tables: %w", err)
	}
	return true, nil
}
