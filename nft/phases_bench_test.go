package nft

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// phaseCapture keeps the durations of the last "full sync phases" record
// (logged at V(2)), for the full-sync benchmark to report.
type phaseCapture struct {
	mu     sync.Mutex
	phases map[string]time.Duration
}

func (c *phaseCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *phaseCapture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *phaseCapture) WithGroup(string) slog.Handler            { return c }

func (c *phaseCapture) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "full sync phases" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phases = map[string]time.Duration{}
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindDuration {
			c.phases[a.Key] = a.Value.Duration()
		}
		return true
	})
	return nil
}

// report adds the last full sync's phases (ms) to b's metrics.
func (c *phaseCapture) report(b *testing.B) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range []string{"build", "diff", "encode"} {
		b.ReportMetric(c.phases[k].Seconds()*1000, k+"-ms")
	}
}
