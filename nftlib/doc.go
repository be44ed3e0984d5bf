// Package nftlib is a general nftables library over netlink; it knows
// nothing of Kubernetes. Its parts:
//
//   - the vocabulary: Ruleset, Table (fixed chains and maps, plus fragments
//     kept apart by key so that a caller rebuilds and diffs only those that
//     changed), Chain, Rule, Map, Element, and the match and action Terms,
//     each kind in its own file (term_<kind>.go) with its text, netlink
//     expressions, direct encoding, decoding and trace evaluation, all
//     listed in termKinds;
//   - text: rendering a Ruleset or a SetTable as `nft -f` input, and
//     tracing a packet through a Ruleset (Trace);
//   - encoding: a Batch of netlink messages, written directly for our terms
//     and checked against github.com/google/nftables' expressions;
//   - the Kernel: one NETLINK_NETFILTER socket, optionally in another
//     network namespace, that applies a Batch as one atomic transaction
//     (TxError names the message the kernel refused, ErrTableOwned and
//     ErrTxTooLarge the refusals a retry cannot fix, ErrAnswersLost a
//     verdict the kernel dropped), reads tables back (ReadFamily,
//     ReadTable, TableDrift, Count), lists any table, another program's
//     too, for deleting parts of it (ListTables, ListChains, ListRules,
//     HasChain; Batch.DelRule by handle), follows other processes' commits
//     (WatchTables, Watch) and probes the kernel's features;
//   - the generic table diff: FullTx and DiffTx turn two Tables into the
//     transaction that takes one to the other;
//   - SetTable: a table of plain sets and constant chains, with its own
//     replace, element updates and drift check (the IPVS mode's helper
//     tables);
//   - Dataplane, the interface of all that a sync loop needs, with the
//     Kernel and an in-memory FakeKernel for unprivileged tests.
//
// The nftables mode (package nft) and the IPVS mode (package ipvs) build
// their tables from it; package leftover removes upstream kube-proxy's
// objects through it.
package nftlib
