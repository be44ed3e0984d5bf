// Package proxier holds what both modes share besides the model: the
// sync loop (Loop) that hands each State of package model to a mode, the
// Backend a mode implements, and the Settings both modes read alike
// (cluster CIDRs, local-traffic detection, the masquerade bit, NodePort
// addresses). It knows nothing of the kernel: the modes (packages nft and
// ipvs) implement Backend. It serves nothing either: the health and
// metrics servers are package serve's.
package proxier

import (
	"context"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Backend programs a State into the kernel. Sync is called from one
// goroutine at a time; an error means nothing of that State was applied.
type Backend interface {
	Sync(ctx context.Context, st *model.State) (SyncResult, error)
	// Cleanup removes everything the backend ever created; removed is false
	// when there was nothing to remove.
	Cleanup(ctx context.Context) (removed bool, err error)
}

// SyncResult describes one applied sync.
type SyncResult struct {
	Full     bool // the whole ruleset was rewritten
	Changed  bool // anything was sent to the kernel
	Messages int  // netlink messages in the transaction
	Bytes    int  // size of the transaction
	// Kernel is how long the kernel took to apply the transaction.
	Kernel time.Duration
	// StaleChainsDeleted counts the chains, emptied by an earlier sync,
	// that this one deleted; CleanupOnly says that was all it did.
	StaleChainsDeleted int
	CleanupOnly        bool
	// FollowUpAt, when set, asks for another sync at that time: the
	// backend has work left that must wait (chains emptied by this or an
	// earlier sync, deleted once the kernel has released them).
	FollowUpAt time.Time
}
