// Package nftlib is a general nftables library over netlink; it knows
// nothing of Kubernetes. See Example for a table rendered and traced.
//
// Its parts:
//
//   - the vocabulary: Ruleset, Table (fixed chains and maps, plus fragments
//     kept apart by key so that a caller rebuilds and diffs only those that
//     changed), Chain, Rule, Map (a verdict map, or a plain set, which
//     may hold ranges: Interval), Element, and the match and action Terms.
//     Term is a closed interface: each kind lives in its own file
//     (term_<kind>.go) with its text, netlink expressions, direct encoding,
//     decoding and trace evaluation, all listed in termKinds. A table may
//     hold one sticky set (Table.Sticky: sources remembered per target,
//     with StickyMatch and StickyUpdate);
//   - text: rendering a Ruleset as `nft -f` input, a
//     transaction as nft commands (Tx.Script), and tracing a packet through
//     a Ruleset (Trace);
//   - encoding: a batch of netlink messages, written directly for our terms
//     and checked against github.com/google/nftables' expressions;
//   - the Kernel: one NETLINK_NETFILTER socket, optionally in another
//     network namespace, that applies a transaction (NewTx, CommitTx) atomically
//     (TxError names the message the kernel refused, ErrTableOwned and
//     ErrTxTooLarge the refusals a retry cannot fix, ErrAnswersLost a
//     verdict the kernel dropped), reads tables back (ReadFamily,
//     ReadTable, ReadElements, TableDrift, Count), lists any table, another program's
//     too, for deleting parts of it (ListTables, ListChains, ListRules,
//     HasChain; KernelTx.DelRule by handle), follows other processes' commits
//     (Watch, Monitor, OtherChanges) and probes the kernel's features
//     (ProbeFeatures);
//   - the generic table diff: FullTx and DiffTx turn two Tables into the
//     transaction that takes one to the other;
//   - Dataplane, the interface of all that a sync loop needs, with the
//     Kernel and an in-memory FakeKernel for unprivileged tests.
//
// Its tests use only small tables of their own: the term kinds, the
// encoder, transactions and the table diff, read-back, drift and its
// scoped repair, the change monitor, the feature probe, other programs'
// tables, and the FakeKernel against the kernel on the same cases (the
// kernel ones as root, each in a network namespace of its own).
package nftlib
