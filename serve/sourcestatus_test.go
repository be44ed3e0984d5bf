package serve

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

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
