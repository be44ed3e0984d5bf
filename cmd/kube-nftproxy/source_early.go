package main

import "sync"

// earlySource holds what the API source reports between its start, which
// comes first (its TLS handshake and listing overlap the kernel's set-up:
// the instance lock, sysctls, nftables probes, servers), and the moment the
// loop, health and metrics exist to take it (wire). Before then it keeps
// the failures, the last recovery and readiness, and hands them on, in
// that order, when wired; afterwards it passes each call straight on.
type earlySource struct {
	mu    sync.Mutex
	wired bool
	to    sourceCallbacks
	// Held until wired: failures (count and the last error), whether a
	// recovery followed the last one, and readiness.
	failures  int
	lastErr   error
	recovered bool
	ready     bool
}

// sourceCallbacks are where a wired earlySource passes its calls.
type sourceCallbacks struct {
	changed, ready func()
	failing        func(error)
	ok             func()
}

func (e *earlySource) changed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wired {
		e.to.changed()
	}
	// Before wiring, a change needs no keeping: readiness asks for a sync.
}

func (e *earlySource) readyNow() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wired {
		e.to.ready()
		return
	}
	e.ready = true
}

func (e *earlySource) failing(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wired {
		e.to.failing(err)
		return
	}
	e.failures, e.lastErr, e.recovered = e.failures+1, err, false
}

func (e *earlySource) ok() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wired {
		e.to.ok()
		return
	}
	e.recovered = e.failures > 0
}

// wire passes what happened so far to cb, then every later call.
func (e *earlySource) wire(cb sourceCallbacks) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.to, e.wired = cb, true
	for range e.failures {
		cb.failing(e.lastErr)
	}
	if e.recovered {
		cb.ok()
	}
	if e.ready {
		cb.ready()
	}
}
