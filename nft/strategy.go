package nft

// Strategy is how a Backend cuts and sends its work: when the delta folds,
// when a first sync is staged, how large transactions spare memory, when a
// full sync settles. None of it changes what the kernel holds after a
// sync. The zero value is the product's: a zero field means the default
// named on it, documented once beside its constant.
type Strategy struct {
	// FoldAt is how many service ports the delta may hold before a sync
	// folds it, whatever else it does; 0: max(64, services/16).
	FoldAt int
	// StageRules is the least size (rules) of a staged transaction; a full
	// sync of at least twice that into tables the kernel lacks is staged
	// (see stagesFull); 0: defaultStageRules.
	StageRules int
	// StagePieces is about how many staged transactions of Service chains
	// a staged sync is cut into; 0: defaultStagePieces.
	StagePieces int
	// StageReleaseBytes is how many bytes of messages a staged sync hands
	// to the kernel between two calls of OnLargeTxRound; 0:
	// defaultStageReleaseBytes.
	StageReleaseBytes int
	// LargeTxRules is the size (rules) from which a transaction is encoded
	// and sent inside OnLargeTx; 0: largeTxRules.
	LargeTxRules int
	// LargeTxRound is how many rules of a large transaction are encoded
	// between two calls of OnLargeTxRound; 0: two fifths of the
	// transaction's (see releaseRound).
	LargeTxRound int
	// OnLargeTx, when set, is called before a transaction of at least
	// LargeTxRules rules is encoded, and the function it returns once the
	// transaction is sent (or failed). The encoded messages, which grow
	// with the ruleset, live outside the Go heap until then: the process
	// can collect its garbage first and keep the heap from growing on top
	// of them (see cmd/kube-nftproxy's largeTxMemory).
	OnLargeTx func() (done func())
	// OnLargeTxRound, when set, is called within OnLargeTx each time
	// another LargeTxRound rules are encoded and dropped from the sync's
	// tables, which nothing uses after the sync, and in a staged sync after
	// every second piece once StageReleaseBytes more were sent: the process
	// can collect and hand them back, so that it never holds all the rules
	// beside all the messages.
	OnLargeTxRound func()
	// DeferSettle leaves the transaction that settles a large full sync
	// (see committer.settle) to Settle, which the sync loop calls once it
	// has reported the sync, instead of doing it within Sync: the rules
	// are in place (and the proxy reports it) one kernel walk of every
	// chain earlier, at start-up above all. A Sync before Settle settles
	// first.
	DeferSettle bool
}

// largeTxRules is the size (rules written) from which a transaction is
// encoded and sent inside Strategy.OnLargeTx: about 16k Services x
// 10 endpoints in the iptables-mode topology (three rules an endpoint).
// The guard costs a full collection; below that size it saved little peak
// RSS for the time it added to synced, so smaller transactions go without.
const largeTxRules = 500_000

// defaultStageRules is the least number of rules a staged transaction of
// Service chains carries; a sync of twice that or more is staged (about
// 700 Services x 10 endpoints). Smaller pieces would each add a commit
// (a walk of every chain) for little encoding to hide.
const defaultStageRules = 10_000

// defaultStagePieces is about how many staged transactions of Service chains a
// large sync is cut into: each commit walks every chain of the namespace,
// so more of them would cost the kernel more, and fewer would put more
// of the build and encoding before the first commit.
const defaultStagePieces = 8

// defaultStageReleaseBytes: a release (OnLargeTxRound) is a full
// collection of the process's heap, 130-270 ms at 44,000 Services x 1 with
// the informers' objects live. Pieces that small reach the kernel faster
// than that, and four releases, not the kernel, set the sync's pace (2.94
// s to 1.87 s of kernel). 50k x 10 passes this every second piece.
const defaultStageReleaseBytes = 64 << 20

// withDefaults is s with each zero size replaced by its default, but
// FoldAt and LargeTxRound, whose defaults depend on the sync.
func (s Strategy) withDefaults() Strategy {
	if s.StageRules == 0 {
		s.StageRules = defaultStageRules
	}
	if s.StagePieces == 0 {
		s.StagePieces = defaultStagePieces
	}
	if s.StageReleaseBytes == 0 {
		s.StageReleaseBytes = defaultStageReleaseBytes
	}
	if s.LargeTxRules == 0 {
		s.LargeTxRules = largeTxRules
	}
	return s
}

// foldLimit is how many service ports the delta may hold, of total.
func (s Strategy) foldLimit(total int) int {
	if s.FoldAt > 0 {
		return s.FoldAt
	}
	return max(64, total/16)
}

// releaseRound is how many rules of a large transaction of rules are
// encoded between two calls of OnLargeTxRound: by default two fifths, so
// that it is called twice (the last fifth goes with the transaction).
// Each call costs a collection of the heap, and what counts is what is
// resident at the end of the encoding: the messages (larger than the
// rules) and the rules not yet let go. Two calls lower the peak RSS almost
// as much as many, one call or none less (docs/benchmarks.md, "Memory").
func (s Strategy) releaseRound(rules int) int {
	if s.LargeTxRound > 0 {
		return s.LargeTxRound
	}
	return rules * 2 / 5
}
