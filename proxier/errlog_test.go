package proxier

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A failure that repeats is logged once per interval, with how many were
// held back; a different error and the recovery are logged at once.
func TestErrorLogRateLimits(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	e := newErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), 30*time.Second)
	e.now = func() time.Time { return now }
	down := errors.New("connection refused")
	for i := 0; i < 30; i++ { // one a second for 30 s
		e.failed(down, "cannot read")
		now = now.Add(time.Second)
	}
	e.failed(down, "cannot read") // 30 s after the first: logged, 29 held back
	e.failed(errors.New("forbidden"), "cannot read")
	e.recovered("fine again")
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

// A source's failures are one failure whatever their text (each informer
// names its own URL).
func TestSourceStatusRateLimitsAnyText(t *testing.T) {
	var buf bytes.Buffer
	h := NewHealth(time.Minute)
	m := NewMetrics()
	s := NewSourceStatus("api", slog.New(slog.NewTextHandler(&buf, nil)), time.Hour, h, m).AnyText()
	for i := 0; i < 10; i++ {
		s.Failing(fmt.Errorf("listing kind %d: connection refused", i))
	}
	s.OK()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "kind 0") || !strings.Contains(lines[1], "fine again") {
		t.Errorf("want the first failure and the recovery logged, got:\n%s", buf.String())
	}
	if v := sampleValue(t, m, "kubenftproxy_source_failures_total", "source", "api"); v != 10 {
		t.Errorf("source_failures_total %v, want 10", v)
	}
	if v := sampleValue(t, m, "kubenftproxy_source_up", "source", "api"); v != 1 {
		t.Errorf("source_up %v after recovery, want 1", v)
	}
}
