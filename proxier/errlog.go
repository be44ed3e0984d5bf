package proxier

import (
	"context"
	"log/slog"
	"time"
)

// errorLog logs a failure that repeats without flooding the log: the first
// one at once, the same error again at most once per interval (with how many
// were held back), a different error at once, and the recovery.
type errorLog struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time
	// anyText treats every error as the same one: for a source whose
	// retries name a different URL each time.
	anyText bool
	// level of the failure lines (the zero value is info: set it).
	level slog.Level

	failing    bool
	lastText   string
	lastLogged time.Time
	held       int // failures not logged since lastLogged
	since      time.Time
}

func newErrorLog(log *slog.Logger, interval time.Duration) *errorLog {
	return &errorLog{log: log, interval: interval, now: time.Now, level: slog.LevelError}
}

// failed records a failure and logs it unless the same one was logged
// within the interval.
func (e *errorLog) failed(err error, msg string, args ...any) {
	now := e.now()
	if !e.failing {
		e.failing, e.since = true, now
	}
	text := err.Error()
	if (text == e.lastText || e.anyText) && e.lastText != "" && now.Sub(e.lastLogged) < e.interval {
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
	e.log.Log(context.Background(), e.level, msg, args...)
	e.lastText, e.lastLogged, e.held = text, now, 0
}

// recovered logs the end of a run of failures.
func (e *errorLog) recovered(msg string, args ...any) {
	if !e.failing {
		return
	}
	e.log.Info(msg, append(args, "failed_for", e.now().Sub(e.since).Round(time.Millisecond))...)
	e.failing, e.lastText, e.held = false, "", 0
}
