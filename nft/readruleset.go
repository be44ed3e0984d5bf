package nft

import (
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// ReadRuleset reads from k our tables (main, delta and affinity, both families) as
// the kernel holds them back into a Ruleset: chains with their rules decoded
// into terms, maps with their elements, comments. Every chain and element
// goes into the table's fixed lists (the kernel does not know which Service
// port a chain belongs to beyond its comment). It is what `diff` and
// `trace` read when they look at the live tables; a rule whose expressions
// are not ones we write is an error naming it.
func ReadRuleset(k *nftlib.Kernel, tableName string) (*nftlib.Ruleset, error) {
	rs := &nftlib.Ruleset{}
	for _, f := range nftlib.Families {
		names := map[string]TableKind{tableName: MainTable, tableName + deltaSuffix: DeltaTable, tableName + affinitySuffix: AffinityTable}
		cfg := DefaultConfig()
		cfg.ClusterIPChecks = true // knows the nftables mode's set too
		template := BuildTable(f, cfg, model.Node{}, MainTable)
		template.Sticky, template.StickyComment = setAffinity, setAffinityComment // the affinity table's
		for _, name := range []string{tableName, tableName + deltaSuffix, tableName + affinitySuffix} {
			kt, err := k.TableInfo(f, name)
			if err != nil {
				return nil, err
			}
			if !kt.Exists {
				continue
			}
			t, err := k.ReadTable(f, name, template)
			if err != nil {
				return nil, err
			}
			t.Secondary = names[name] != MainTable
			t.Comment = kt.Comment()
			rs.Tables = append(rs.Tables, t)
		}
	}
	return rs, nil
}
