package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
	"github.com/kube-nftproxy/kube-nftproxy/sysctlrecord"
)

// nodeSysctls writes the node's sysctls and module parameters and
// remembers what it changed, for the record --cleanup restores from
// (sysctlrecord).
type nodeSysctls struct {
	journal sysctl.Journal
}

// proc is /proc/sys.
func (n *nodeSysctls) proc() *sysctl.Sysctl {
	return sysctl.New(sysctl.DefaultRoot).WithJournal(&n.journal)
}

// tuner is conntrack's tuner over /proc/sys and /sys/module.
func (n *nodeSysctls) tuner(log *slog.Logger) *conntrack.Tuner {
	t := conntrack.NewTuner(log)
	t.Sysctl = t.Sysctl.WithJournal(&n.journal)
	t.Module = t.Module.WithJournal(&n.journal)
	return t
}

// record adds what was changed to the kernel's record. A failure costs
// only the restore at --cleanup: it is a warning.
func (n *nodeSysctls) record(k *nftlib.Kernel, log *slog.Logger) {
	changes := n.journal.Changes()
	if err := sysctlrecord.Save(k, changes); err != nil {
		log.Warn("could not record the sysctls changed: --cleanup will not put them back", "err", err)
		return
	}
	for _, c := range changes {
		log.Debug("sysctl changed, recorded for --cleanup", "key", c.Path, "before", c.Before, "now", c.After)
	}
}

// restoreRoots are the trees a record's keys may be under.
func restoreRoots() []*sysctl.Sysctl {
	return []*sysctl.Sysctl{sysctl.New(sysctl.DefaultRoot), sysctl.New(sysctl.ModuleRoot)}
}

// restoreSysctls puts back the sysctls the record names (--cleanup) and
// says which; whether it did any. One it cannot write (no writable
// /proc/sys: run --cleanup privileged) is a warning, and the record stays.
func restoreSysctls(k *nftlib.Kernel, out io.Writer, log *slog.Logger) bool {
	restored, err := sysctlrecord.Restore(k, restoreRoots(), log)
	if err != nil {
		log.Warn("could not put every sysctl back", "err", err)
	}
	for _, c := range restored {
		fmt.Fprintf(out, "put back %s = %s (the proxy had set %s)\n", c.Path, c.Before, c.After)
	}
	return len(restored) > 0
}
