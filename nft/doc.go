// Package nft is the nftables mode: kube-proxy's Services as nftables
// tables, built and applied with package nftlib.
//
// Config holds the mode's flags (the ones it shares with the IPVS mode are
// proxier.Settings). Build, BuildTable and BuildFragment turn a
// model.State into nftlib Tables (a main table, a delta table for the
// service ports changed lately, an affinity table for those with session
// affinity) whose chain names are iptables mode's (names.go), each service
// port's chains and map elements a fragment keyed by its name. Backend is
// the proxier.Backend: each Sync plans the tables, diffs them against what
// was applied (or, on a full sync, against the kernel), commits one
// transaction over an nftlib.Dataplane and records the result, with a
// drift check and stale-chain clean-up on the side. ReadRuleset reads the
// mode's tables back for `diff` and `trace`.
package nft
