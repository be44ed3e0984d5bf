// Package loglevel names the log/slog levels that stand for klog's
// verbosity levels. The packages log with *slog.Logger; the command bridges
// that logger to klog (logr's slog handler), which logs a record of level
// slog.Level(-n) at V(n), and records of slog.LevelWarn and
// slog.LevelError as klog warnings and errors. These constants let a
// package log an event at the V level kube-proxy uses for the same kind of
// event, so that -v filters our messages as it filters kube-proxy's.
package loglevel

import "log/slog"

const (
	// V2 is klog's V(2): routine changes kube-proxy logs at V(2), such as
	// opening and closing a health check node port, or why the OOM score
	// adjustment could not be set.
	V2 = slog.Level(-2)
	// V4 is klog's V(4), slog.LevelDebug: details of each sync (the
	// conntrack cleanup's figures, endpoint counts, settings left as they
	// were), as kube-proxy logs them at V(4).
	V4 = slog.LevelDebug
)
