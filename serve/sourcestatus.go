package serve

import (
	"log/slog"
	"sync"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/kube-nftproxy/kube-nftproxy/internal/errlog"
)

// SourceStatus is where a source of Services (the API server, the state
// files) reports that it cannot read what it watches, and that it can
// again. Meanwhile the rules keep the source's last good view. It logs
// (rate-limited, with the reason), counts the failures, and tells Health,
// which turns /healthz unhealthy once the failure has lasted its Timeout.
type SourceStatus struct {
	name   string
	health *Health

	mu       sync.Mutex
	log      *errlog.Log
	failures metrics.CounterMetric
	up       metrics.GaugeMetric
}

// NewSourceStatus returns the status of the source called name ("api",
// "file"), logging at most every logEvery for the same error. health and
// metrics may be nil.
func NewSourceStatus(name string, log *slog.Logger, logEvery time.Duration, health *Health, m *Metrics) *SourceStatus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &SourceStatus{name: name, health: health, log: errlog.New(log.With("source", name), logEvery)}
	// A source that cannot be read is a warning: the rules keep working
	// on the last good view (sync failures are errors).
	s.log.Level = slog.LevelWarn
	if m != nil {
		s.failures = m.SourceFailures.WithLabelValues(name)
		s.up = m.SourceUp.WithLabelValues(name)
		s.up.Set(1)
	}
	return s
}

// AnyText makes every failure count as the same one for rate-limiting,
// whatever its text: for a source whose retries each name their own URL.
// Without it, an error with a new text (another file) is logged at once.
func (s *SourceStatus) AnyText() *SourceStatus {
	s.log.AnyText = true
	return s
}

// Failing reports a failure to read the source.
func (s *SourceStatus) Failing(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log.Failed(err, "cannot read the source of Services; the rules keep its last good view")
	if s.failures != nil {
		s.failures.Inc()
		s.up.Set(0)
	}
	if s.health != nil {
		s.health.SourceFailing(s.name)
	}
}

// OK reports that the source reads fine (again). It is cheap when nothing
// was failing.
func (s *SourceStatus) OK() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log.Recovered("the source of Services reads fine again")
	if s.up != nil {
		s.up.Set(1)
	}
	if s.health != nil {
		s.health.SourceOK()
	}
}
