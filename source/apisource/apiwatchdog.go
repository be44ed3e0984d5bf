package apisource

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// apiWatchdog notices an API server that is gone, hung or unreachable, which
// the informers alone do not report: a refused watch is retried silently,
// and a watch on a connection that no longer carries packets waits for
// HTTP/2 and TCP timeouts. It probes the server once per period (one small
// request per node), and while probes fail, more often with backoff until
// one is answered. A probe without an answer holds the informers' requests
// back and closes the connections, so that the watches start again, on new
// connections, as soon as a probe is answered.
type apiWatchdog struct {
	probe   func(context.Context) error
	every   time.Duration // between probes while the server answers
	timeout time.Duration // of one probe
	// retryMin and retryMax bound the pause between probes while
	// failing; minGap is the shortest pause even when kicked.
	retryMin, retryMax, minGap time.Duration

	gate        *requestGate // nil: requests are never held
	closeConns  func()       // nil: connections are left to their timeouts
	onError     func(error)
	onRecovered func()

	kick     chan struct{}
	reported atomic.Bool // a failure was reported from outside the loop
}

func newAPIWatchdog(probe func(context.Context) error, every time.Duration) *apiWatchdog {
	w := &apiWatchdog{
		probe: probe, every: every, timeout: min(every, 5*time.Second),
		retryMin: 500 * time.Millisecond, retryMax: min(every, 5*time.Second), minGap: 200 * time.Millisecond,
		kick: make(chan struct{}, 1),
	}
	w.retryMin = min(w.retryMin, w.retryMax)
	return w
}

// failed reports a failure seen elsewhere (an informer's list or watch,
// a connection that could not be opened) and has the server probed now.
func (w *apiWatchdog) failed(err error) {
	w.reported.Store(true)
	if w.onError != nil {
		w.onError(err)
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run probes until ctx is done.
func (w *apiWatchdog) run(ctx context.Context) {
	failing := false
	pause := w.every
	timer := time.NewTimer(pause)
	defer timer.Stop()
	last := time.Now()
	for {
		if !w.waitNext(ctx, timer, last) {
			return
		}
		err := w.probeOnce(ctx)
		last = time.Now()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			w.answered(w.reported.Swap(false) || failing)
			failing, pause = false, w.every
		case failing:
			pause = min(2*pause, w.retryMax)
			w.probeFailed(err)
		default:
			failing, pause = true, w.retryMin
			w.probeFailed(err)
		}
		timer.Reset(jitter(pause))
	}
}

// waitNext waits for the timer, or a kick at least minGap after the last
// probe; false when ctx is done.
func (w *apiWatchdog) waitNext(ctx context.Context, timer *time.Timer, last time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-w.kick:
			if gap := w.minGap - time.Since(last); gap > 0 {
				timer.Reset(gap)
				continue
			}
			return true
		}
	}
}

// probeOnce probes the server with the probe timeout.
func (w *apiWatchdog) probeOnce(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(context.WithValue(ctx, probeKey{}, true), w.timeout)
	defer cancel()
	start := time.Now()
	err := w.probe(pctx)
	if refusedByPolicy(err) {
		return nil
	}
	if err != nil && pctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("probing the API server: no answer within %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	if err != nil {
		return fmt.Errorf("probing the API server: %w", err)
	}
	return nil
}

// probeFailed reports a failed probe. Without an answer from the server,
// the informers' requests are held back until one comes, and the
// connections are closed: a watch on a hung or blackholed connection
// would otherwise wait for its timeouts. An answer with an error status
// (the server is there but unwell) neither holds nor closes anything.
func (w *apiWatchdog) probeFailed(err error) {
	if w.onError != nil {
		w.onError(err)
	}
	if answered(err) {
		return
	}
	if w.gate != nil {
		w.gate.hold()
	}
	if w.closeConns != nil {
		w.closeConns()
	}
}

// answered lets held requests go after a probe was answered, and reports
// the recovery if something failed before, unless the informers' last
// list or watch was refused: then the next answered probe tells again.
func (w *apiWatchdog) answered(wasFailing bool) {
	if w.gate != nil {
		w.gate.release()
	}
	if !wasFailing {
		return
	}
	if w.gate != nil && w.gate.isRefused() {
		w.reported.Store(true)
		return
	}
	if w.onRecovered != nil {
		w.onRecovered()
	}
}

// refusedByPolicy reports whether err is an answer of 4xx (the probe's path
// not allowed, say, or throttled): the server is there and well enough to
// say no, and the informers' own errors would tell if they were refused too.
func refusedByPolicy(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500
}

// answered reports whether err carries an HTTP answer from the server.
func answered(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status)
}

// jitter spreads d by -10..+10%, so that the probes of many nodes do not
// line up.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}
