// Package errlog logs a failure that repeats without flooding the log:
// the sync loop's failed syncs and a source's failed reads (Log); and a
// level that crosses a mark, once per crossing (Mark).
package errlog

import (
	"context"
	"log/slog"
	"time"
)

// Log logs a failure that repeats: the first one at once, the same error
// again at most once per interval (with how many were held back), a
// different error at once, and the recovery. It is not safe for
// concurrent use.
type Log struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time
	// AnyText treats every error as the same one: for a source whose
	// retries name a different URL each time.
	AnyText bool
	// Level of the failure lines (New sets slog.LevelError).
	Level slog.Level

	failing    bool
	lastText   string
	lastLogged time.Time
	held       int // failures not logged since lastLogged
	since      time.Time
}

// New returns a Log writing to log, repeating an error at most once per
// interval.
func New(log *slog.Logger, interval time.Duration) *Log {
	return &Log{log: log, interval: interval, now: time.Now, Level: slog.LevelError}
}

// Failed records a failure and logs it unless the same one was logged
// within the interval.
func (e *Log) Failed(err error, msg string, args ...any) {
	now := e.now()
	if !e.failing {
		e.failing, e.since = true, now
	}
	text := err.Error()
	if (text == e.lastText || e.AnyText) && e.lastText != "" && now.Sub(e.lastLogged) < e.interval {
		e.held++
		return
	}
	args = append(args, "err", err)
	if e.held > 0 {
		args = append(args, "repeated", e.held)
	}
	if now != e.since {
		args = append(args, "failing_for", now.Sub(e.since).Round(time.Second))
	}
	e.log.Log(context.Background(), e.Level, msg, args...)
	e.lastText, e.lastLogged, e.held = text, now, 0
}

// Recovered logs the end of a run of failures.
func (e *Log) Recovered(msg string, args ...any) {
	if !e.failing {
		return
	}
	e.log.Info(msg, append(args, "failed_for", e.now().Sub(e.since).Round(time.Millisecond))...)
	e.failing, e.lastText, e.held = false, "", 0
}
