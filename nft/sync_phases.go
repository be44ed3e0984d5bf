package nft

import (
	"context"
	"log/slog"
	"time"
)

// syncPhases times the steps of one sync, for the log of a full sync at
// V(2) (kube-proxy logs its sync's time at that level too): where a first
// sync's time goes besides the kernel's commit.
type syncPhases struct {
	start, last time.Time
	// build: the tables wanted; read: what the kernel holds; diff: the
	// table transactions; encode: the netlink batch; commit: the
	// transaction, kernel included (kernel: the kernel's part); settle:
	// the empty transaction after a large full sync.
	build, read, diff, encode, commit, kernel, settle time.Duration
	// staged is how many staged transactions came before the sync's
	// (see stagesFull): their build and encoding are then part of commit.
	staged int
}

func newSyncPhases() *syncPhases {
	now := time.Now()
	return &syncPhases{start: now, last: now}
}

// lap returns the time since the last lap (or the start).
func (p *syncPhases) lap() time.Duration {
	now := time.Now()
	d := now.Sub(p.last)
	p.last = now
	return d
}

// levelPhases is V(2) through the klog bridge (slog.Level(-n) is V(n)).
const levelPhases = slog.Level(-2)

// log writes the phases of a full sync, when V(2) is on.
func (p *syncPhases) log(log *slog.Logger) {
	if !log.Enabled(context.Background(), levelPhases) {
		return
	}
	log.Log(context.Background(), levelPhases, "full sync phases",
		"build", p.build, "read", p.read, "diff", p.diff, "encode", p.encode,
		"commit", p.commit, "kernel", p.kernel, "settle", p.settle, "staged", p.staged, "total", time.Since(p.start))
}
