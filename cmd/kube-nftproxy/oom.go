package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/kube-nftproxy/kube-nftproxy/internal/loglevel"
)

// defaultOOMScoreAdj is kube-proxy's --oom-score-adj default: the kernel
// kills the proxy after almost everything else when memory runs out, as
// node networking depends on it.
const defaultOOMScoreAdj = -999

// oomScoreAdjPath is where the process's OOM score adjustment is set.
const oomScoreAdjPath = "/proc/self/oom_score_adj"

// validateOOMScoreAdj checks --oom-score-adj or oomScoreAdj in --config
// (what names it) as kube-proxy does.
func validateOOMScoreAdj(what string, v int32) error {
	if v < -1000 || v > 1000 {
		return fmt.Errorf("%s %d: must be within the range [-1000, 1000]", what, v)
	}
	return nil
}

// applyOOMScoreAdj writes v to path, once at start, as kube-proxy does.
// As there, a failure (lowering the score needs CAP_SYS_RESOURCE, which
// the DaemonSet in deploy/ does not grant) is only logged, at debug level
// (kube-proxy's V(2)): the proxy works the same without it.
func applyOOMScoreAdj(path string, v int32, log *slog.Logger) {
	if err := os.WriteFile(path, []byte(strconv.Itoa(int(v))), 0o644); err != nil {
		log.Log(context.Background(), loglevel.V2, "could not set the OOM score adjustment", "value", v, "err", err)
		return
	}
	log.Log(context.Background(), loglevel.V2, "OOM score adjustment set", "value", v)
}
