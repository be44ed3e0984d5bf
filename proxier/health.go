package proxier

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health tracks whether syncs keep up, as kube-proxy's proxier health
// server does: unhealthy when a change was queued and no sync has finished
// within Timeout since (a stuck or failing proxy).
type Health struct {
	// Timeout is how long a queued change may wait for a sync
	// (kube-proxy: twice the sync period).
	Timeout time.Duration
	now     func() time.Time

	mu           sync.Mutex
	lastUpdated  time.Time // last successful sync
	oldestQueued time.Time // first change not yet synced; zero when none
	nodeEligible bool
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

type healthBody struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
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

// Handler serves /healthz (also 503 when the node is not eligible for load
// balancer traffic) and /livez (syncs only), with kube-proxy's JSON body.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(withNode bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			h.mu.Lock()
			now := h.now()
			ok := h.healthy(now)
			body := healthBody{LastUpdated: h.lastUpdated, CurrentTime: now}
			if withNode {
				eligible := h.nodeEligible
				body.NodeEligible = &eligible
				ok = ok && eligible
			}
			h.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(body)
		}
	}
	mux.HandleFunc("/healthz", serve(true))
	mux.HandleFunc("/livez", serve(false))
	return mux
}
