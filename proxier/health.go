package proxier

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health tracks whether syncs keep up, as kube-proxy's proxier health
// server does: unhealthy when a change was queued and no sync has finished
// within Timeout since (a stuck or failing proxy). /healthz also says not
// ready until the first sync of a complete view has succeeded, and turns
// unhealthy when the source of Services has been failing for Timeout (the
// rules keep the last good view meanwhile).
type Health struct {
	// Timeout is how long a queued change may wait for a sync
	// (kube-proxy: twice the sync period).
	Timeout time.Duration
	// Answered, when set, is called with each answer of the handler:
	// the probe ("healthz" or "livez") and the HTTP status code
	// (Metrics.CountProbe: kubeproxy_proxy_{healthz,livez}_total).
	Answered func(probe string, code int)
	now      func() time.Time

	mu           sync.Mutex
	lastUpdated  time.Time // last successful sync
	oldestQueued time.Time // first change not yet synced; zero when none
	nodeEligible bool
	sourceSince  time.Time // when the source began failing; zero when fine
	sourceErr    string
	lastDrift    time.Time // when the kernel last differed from what we wrote
	drifts       uint64
}

// NewHealth returns a Health that is healthy until a change waits too long.
func NewHealth(timeout time.Duration) *Health {
	return &Health{Timeout: timeout, now: time.Now, nodeEligible: true}
}

// Queued records that a change waits for a sync.
func (h *Health) Queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestQueued.IsZero() {
		h.oldestQueued = h.now()
	}
}

// Updated records a successful sync: everything queued so far is done.
func (h *Health) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.oldestQueued = time.Time{}
}

// SetNodeEligible records whether this node should get load balancer
// traffic (false while the Node is being deleted or tainted for removal).
func (h *Health) SetNodeEligible(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = ok
}

// SourceFailing records that the source of Services cannot be read (the
// API server unreachable, a state file unreadable); the first call of a
// run of failures starts the clock.
func (h *Health) SourceFailing(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sourceSince.IsZero() {
		h.sourceSince = h.now()
	}
	h.sourceErr = err.Error()
}

// SourceOK records that the source reads fine again.
func (h *Health) SourceOK() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sourceSince, h.sourceErr = time.Time{}, ""
}

// Drifted records that the kernel's rules differed from what we wrote and
// were rewritten.
func (h *Health) Drifted() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastDrift = h.now()
	h.drifts++
}

// healthBody is kube-proxy's /healthz body (lastUpdated, currentTime,
// nodeEligible) plus what explains a 503 here.
type healthBody struct {
	LastUpdated  time.Time  `json:"lastUpdated"`
	CurrentTime  time.Time  `json:"currentTime"`
	NodeEligible *bool      `json:"nodeEligible,omitempty"`
	Synced       *bool      `json:"synced,omitempty"`
	SourceError  string     `json:"sourceError,omitempty"`
	SourceSince  *time.Time `json:"sourceFailingSince,omitempty"`
	LastDrift    *time.Time `json:"lastDriftRepaired,omitempty"`
	DriftRepairs uint64     `json:"driftRepairs,omitempty"`
}

// Healthy reports whether syncs keep up now.
func (h *Health) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy(h.now())
}

// healthy reports whether syncs keep up.
func (h *Health) healthy(now time.Time) bool {
	return h.oldestQueued.IsZero() || now.Sub(h.oldestQueued) < h.Timeout
}

// Handler serves /healthz and /livez with kube-proxy's JSON body. /livez
// fails only when syncs do not keep up (a restart could help); /healthz
// also fails before the first successful sync, while the source has been
// failing for Timeout, and when the node is not eligible for load balancer
// traffic.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(probe string, withNode bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			h.mu.Lock()
			now := h.now()
			ok := h.healthy(now)
			body := healthBody{LastUpdated: h.lastUpdated, CurrentTime: now, SourceError: h.sourceErr, DriftRepairs: h.drifts}
			if !h.sourceSince.IsZero() {
				since := h.sourceSince
				body.SourceSince = &since
			}
			if !h.lastDrift.IsZero() {
				drift := h.lastDrift
				body.LastDrift = &drift
			}
			if withNode {
				eligible, synced := h.nodeEligible, !h.lastUpdated.IsZero()
				body.NodeEligible, body.Synced = &eligible, &synced
				sourceOK := h.sourceSince.IsZero() || now.Sub(h.sourceSince) < h.Timeout
				ok = ok && eligible && synced && sourceOK
			}
			h.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			code := http.StatusOK
			if !ok {
				code = http.StatusServiceUnavailable
			}
			if h.Answered != nil {
				h.Answered(probe, code)
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(body)
		}
	}
	mux.HandleFunc("/healthz", serve("healthz", true))
	mux.HandleFunc("/livez", serve("livez", false))
	return mux
}
