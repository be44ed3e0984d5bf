package errlog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A failure that repeats is logged once per interval, with how many were
// held back; a different error and the recovery are logged at once.
func TestLogRateLimits(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	e := New(slog.New(slog.NewTextHandler(&buf, nil)), 30*time.Second)
	e.now = func() time.Time { return now }
	down := errors.New("connection refused")
	for i := 0; i < 30; i++ { // one a second for 30 s
		e.Failed(down, "cannot read")
		now = now.Add(time.Second)
	}
	e.Failed(down, "cannot read") // 30 s after the first: logged, 29 held back
	e.Failed(errors.New("forbidden"), "cannot read")
	e.Recovered("fine again")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("logged %d lines, want 4:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "repeated=29") || !strings.Contains(lines[1], "failing_for=30s") {
		t.Errorf("second line %q lacks repeated=29 failing_for=30s", lines[1])
	}
	if !strings.Contains(lines[2], "forbidden") || !strings.Contains(lines[3], "fine again") {
		t.Errorf("a new error or the recovery was not logged at once:\n%s", buf.String())
	}
}
