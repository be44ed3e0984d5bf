package serve

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health tracks whether syncs keep up, as kube-proxy's proxier health
// server does: unhealthy when a change was queued and no sync has finished
// within Timeout since (a stuck or failing proxy). Our /readyz also says
// not ready until the first sync of a complete view has succeeded, and
// while the source of Services has been failing for Timeout (the rules
// keep the last good view meanwhile).
type Health struct {
	// Timeout is how long a queued change may wait for a sync
	// (kube-proxy: twice the sync period).
	Timeout time.Duration
	// FailTimeout is how long syncs may fail in a row before /readyz
	// fails (the sync period; zero: Timeout/2): meanwhile the kernel
	// holds something other than what the proxy wants, e.g. our table
	// replaced by one another process owns.
	FailTimeout time.Duration
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
	sourceKind   string    // which source is failing ("api", "file")
	lastDrift    time.Time // when the kernel last differed from what we wrote
	drifts       uint64
	failingSince time.Time // first failed sync of the current run; zero when the last succeeded
	failLogged   bool      // SyncFailed reported the run past FailTimeout
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
	h.failingSince, h.failLogged = time.Time{}, false
}

// SyncFailed records a failed sync. It returns true once per run of
// failures, at the first failure that finds the run older than
// FailTimeout: the caller logs that /readyz fails from now on.
func (h *Health) SyncFailed() (overdue bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.failingSince.IsZero() {
		h.failingSince = now
	}
	if h.failLogged || !h.syncsFailing(now) {
		return false
	}
	h.failLogged = true
	return true
}

// syncsFailing reports whether syncs have failed in a row for longer than
// FailTimeout.
func (h *Health) syncsFailing(now time.Time) bool {
	limit := h.FailTimeout
	if limit <= 0 {
		limit = h.Timeout / 2
	}
	return !h.failingSince.IsZero() && now.Sub(h.failingSince) >= limit
}

// SetNodeEligible records whether this node should get load balancer
// traffic (false while the Node is being deleted or tainted for removal).
func (h *Health) SetNodeEligible(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = ok
}

// SourceFailing records that the source of Services of kind source ("api",
// "file") cannot be read (the API server unreachable, a state file
// unreadable); the first call of a run of failures starts the clock. Only
// the kind is kept: the bodies are served to anyone who reaches the health
// port, and the error names files and the API server's address (it goes
// to the log and the metrics: SourceStatus).
func (h *Health) SourceFailing(source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sourceSince.IsZero() {
		h.sourceSince = h.now()
	}
	h.sourceKind = source
}

// SourceOK records that the source reads fine again.
func (h *Health) SourceOK() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sourceSince, h.sourceKind = time.Time{}, ""
}

// Drifted records that the kernel's rules differed from what we wrote and
// were rewritten.
func (h *Health) Drifted() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastDrift = h.now()
	h.drifts++
}

// healthBody is kube-proxy's /healthz and /livez body (lastUpdated,
// currentTime, nodeEligible on /healthz only, healthy, status per IP
// family), plus ours, which explain a 503 of /readyz. As kube-proxy's, it
// holds no error text, path or address: the port is open to the network.
type healthBody struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyHealth `json:"status"`
	Synced       *bool                   `json:"synced,omitempty"`
	SourceKind   string                  `json:"sourceFailing,omitempty"`
	SourceSince  *time.Time              `json:"sourceFailingSince,omitempty"`
	FailingSince *time.Time              `json:"syncFailingSince,omitempty"`
	LastDrift    *time.Time              `json:"lastDriftRepaired,omitempty"`
	DriftRepairs uint64                  `json:"driftRepairs,omitempty"`
}

// familyHealth is one IP family's entry of status: one transaction
// programs both families, so both have the same.
type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Healthy reports whether syncs keep up now.
func (h *Health) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy(h.now())
}

// healthy reports whether syncs keep up: as kube-proxy, healthy before
// the first sync (a family is judged once it has synced), and while no
// queued change has waited Timeout.
func (h *Health) healthy(now time.Time) bool {
	return h.lastUpdated.IsZero() || h.oldestQueued.IsZero() || now.Sub(h.oldestQueued) < h.Timeout
}

// probe is one of the health server's paths.
type probe struct {
	name string // for Answered; "" for /readyz, which kube-proxy lacks
	// withNode adds nodeEligible to the body, and makes a node that is
	// not eligible fail the probe; ready also needs a first sync and a
	// source that reads fine.
	withNode, ready bool
}

// Handler serves kube-proxy's /healthz and /livez, and our /readyz.
// /livez fails only when syncs do not keep up (a restart could help);
// /healthz also when the node is not eligible for load balancer traffic
// (being deleted, or tainted for removal); both answer 200 before the
// first sync, as kube-proxy. /readyz, ours, is /healthz that also fails
// before the first successful sync of a complete view and while the
// source of Services has been failing for Timeout or syncs for
// FailTimeout: a readiness probe,
// so that a rolling update waits for each new pod to program the rules.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", h.serve(probe{name: "healthz", withNode: true}))
	mux.HandleFunc("/livez", h.serve(probe{name: "livez"}))
	mux.HandleFunc("/readyz", h.serve(probe{withNode: true, ready: true}))
	return mux
}

func (h *Health) serve(p probe) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		body, ok := h.answer(p)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		if h.Answered != nil && p.name != "" {
			h.Answered(p.name, code)
		}
		w.WriteHeader(code)
		out, _ := json.Marshal(body)
		_, _ = w.Write(out)
	}
}

// answer is the body of probe p and whether it passes.
func (h *Health) answer(p probe) (healthBody, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	healthy := h.healthy(now)
	body := healthBody{LastUpdated: h.lastUpdated, CurrentTime: now, Healthy: healthy,
		Status: map[string]familyHealth{}, SourceKind: h.sourceKind, DriftRepairs: h.drifts}
	if !h.lastUpdated.IsZero() {
		for _, f := range families {
			body.Status[f] = familyHealth{LastUpdated: h.lastUpdated, Healthy: healthy}
		}
	}
	if !h.sourceSince.IsZero() {
		since := h.sourceSince
		body.SourceSince = &since
	}
	if !h.lastDrift.IsZero() {
		drift := h.lastDrift
		body.LastDrift = &drift
	}
	if !h.failingSince.IsZero() {
		failing := h.failingSince
		body.FailingSince = &failing
	}
	ok := healthy
	if p.withNode {
		eligible := h.nodeEligible
		body.NodeEligible = &eligible
		ok = ok && eligible
	}
	if p.ready {
		synced := !h.lastUpdated.IsZero()
		body.Synced = &synced
		sourceOK := h.sourceSince.IsZero() || now.Sub(h.sourceSince) < h.Timeout
		ok = ok && synced && sourceOK && !h.syncsFailing(now)
	}
	if ok {
		// As kube-proxy: lastUpdated is "now" while healthy (older
		// releases' meaning); status keeps the real times.
		body.LastUpdated = now
	}
	return body, ok
}
