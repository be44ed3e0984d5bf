package apisource

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// fakeRoundTripper answers each request with the next error of errs (nil:
// 200), counting the requests.
type fakeRoundTripper struct {
	mu   sync.Mutex
	errs []error
	sent int
}

func (f *fakeRoundTripper) RoundTrip(*http.Request) (*http.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent++
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		if err != nil {
			return nil, err
		}
	}
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

func TestRequestGate(t *testing.T) {
	t.Run("held while closed, sent on release", func(t *testing.T) {
		g, rt := newRequestGate(), &fakeRoundTripper{}
		g.hold()
		done := make(chan error, 1)
		go func() { done <- doGet(context.Background(), g.wrap(rt), http.MethodGet) }()
		select {
		case err := <-done:
			t.Fatalf("a GET went through a closed gate: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		g.release()
		if err := <-done; err != nil || rt.sent != 1 {
			t.Fatalf("after release: err %v, sent %d; want nil, 1", err, rt.sent)
		}
	})
	t.Run("probes and writes pass a closed gate", func(t *testing.T) {
		g, rt := newRequestGate(), &fakeRoundTripper{}
		g.hold()
		probe := context.WithValue(context.Background(), probeKey{}, true)
		if err := doGet(probe, g.wrap(rt), http.MethodGet); err != nil {
			t.Fatal(err)
		}
		if err := doGet(context.Background(), g.wrap(rt), http.MethodPost); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a held request ends with its context", func(t *testing.T) {
		g := newRequestGate()
		g.hold()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if err := doGet(ctx, g.wrap(&fakeRoundTripper{}), http.MethodGet); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the context's deadline", err)
		}
	})
	t.Run("refused without a watchdog: the caller gets the error", func(t *testing.T) {
		g, rt := newRequestGate(), &fakeRoundTripper{errs: []error{errRefused}}
		if err := doGet(context.Background(), g.wrap(rt), http.MethodGet); !isDialError(err) {
			t.Fatalf("got %v, want the dial error", err)
		}
	})
	t.Run("refused with a watchdog: held, told, and sent again", func(t *testing.T) {
		g, rt := newRequestGate(), &fakeRoundTripper{errs: []error{errRefused}}
		var told atomic.Int32
		g.watchedBy(func(err error) {
			told.Add(1)
			if !g.isHeld() {
				t.Error("the gate was not closed before the watchdog was told")
			}
			go g.release()
		})
		if err := doGet(context.Background(), g.wrap(rt), http.MethodGet); err != nil {
			t.Fatal(err)
		}
		if told.Load() != 1 || rt.sent != 2 {
			t.Fatalf("told %d times, sent %d; want 1, 2", told.Load(), rt.sent)
		}
	})
}

func doGet(ctx context.Context, rt http.RoundTripper, method string) error {
	req, err := http.NewRequestWithContext(ctx, method, "https://127.0.0.1:6443/api/v1/services", nil)
	if err != nil {
		return err
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// watchdogRecorder runs an apiWatchdog on scripted probe results and
// records what it does.
type watchdogRecorder struct {
	mu        sync.Mutex
	results   []error // of the probes, in order; then nil
	probes    int
	errs      []error
	recovered int
	closed    int
}

func (r *watchdogRecorder) probe(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.probes++
	if len(r.results) == 0 {
		return nil
	}
	err := r.results[0]
	r.results = r.results[1:]
	return err
}

func (r *watchdogRecorder) start(t *testing.T, every time.Duration, results ...error) (*apiWatchdog, *requestGate) {
	r.results = results
	w := newAPIWatchdog(r.probe, every)
	w.retryMin, w.retryMax, w.minGap = time.Millisecond, 2*time.Millisecond, 0
	gate := newRequestGate()
	w.gate = gate
	w.closeConns = func() { r.mu.Lock(); r.closed++; r.mu.Unlock() }
	w.onError = func(err error) { r.mu.Lock(); r.errs = append(r.errs, err); r.mu.Unlock() }
	w.onRecovered = func() { r.mu.Lock(); r.recovered++; r.mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, gate
}

func (r *watchdogRecorder) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return ok()
	})
}

func TestAPIWatchdog(t *testing.T) {
	timeout := errors.New("context deadline exceeded")
	unwell := apierrors.NewInternalError(errors.New("etcd unreachable"))
	forbidden := apierrors.NewForbidden(schema.GroupResource{}, "/livez", errors.New("no"))
	for _, tc := range []struct {
		name           string
		results        []error
		errs, closed   int
		recovered      int
		heldAfterFirst bool
	}{
		{"no answer: held and closed until answered", []error{errRefused, timeout}, 2, 2, 1, true},
		{"an error status: reported, nothing held or closed", []error{unwell}, 1, 0, 1, false},
		{"a refusal by policy: the server is there", []error{forbidden}, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &watchdogRecorder{}
			_, gate := r.start(t, time.Millisecond, tc.results...)
			r.waitFor(t, "the scripted probes and one more", func() bool { return r.probes > len(tc.results)+1 })
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.errs) != tc.errs || r.closed != tc.closed || r.recovered != tc.recovered {
				t.Errorf("errors %d (%v), connections closed %d times, recovered %d times; want %d, %d, %d",
					len(r.errs), r.errs, r.closed, r.recovered, tc.errs, tc.closed, tc.recovered)
			}
			if gate.isHeld() {
				t.Error("requests are still held after a probe was answered")
			}
		})
	}
}

// A failure seen elsewhere (an informer, a refused connection) is
// reported at once and has the server probed at once, not a period later;
// its probe answered, the recovery is reported.
func TestAPIWatchdogFailedProbesAtOnce(t *testing.T) {
	r := &watchdogRecorder{}
	w, _ := r.start(t, time.Hour)
	w.failed(errors.New("listing or watching *v1.Service: boom"))
	r.waitFor(t, "a probe and the recovery", func() bool { return r.probes == 1 && r.recovered == 1 })
	if len(r.errs) != 1 {
		t.Errorf("reported %v, want the one failure", r.errs)
	}
}

// The probe holds requests back while failing: an informer's GET waits
// until a probe is answered.
func TestAPIWatchdogHoldsUntilAnswered(t *testing.T) {
	r := &watchdogRecorder{}
	answer := make(chan struct{})
	var calls atomic.Int32
	w := newAPIWatchdog(func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			return errRefused
		}
		select {
		case <-answer:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, time.Hour)
	w.retryMin, w.retryMax, w.timeout = time.Millisecond, time.Millisecond, time.Hour
	w.gate = newRequestGate()
	w.onRecovered = func() { r.mu.Lock(); r.recovered++; r.mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)
	w.failed(errRefused)
	r.waitFor(t, "the gate to close", func() bool { return w.gate.isHeld() })
	rt := &fakeRoundTripper{}
	done := make(chan error, 1)
	go func() { done <- doGet(ctx, w.gate.wrap(rt), http.MethodGet) }()
	select {
	case err := <-done:
		t.Fatalf("a GET went out while probes failed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(answer)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "the recovery", func() bool { return r.recovered == 1 })
}

// An informer refused (403) is not recovered by the server answering
// probes: the recovery waits for a list or watch to be served again.
func TestAPIWatchdogRefusedInformer(t *testing.T) {
	r := &watchdogRecorder{}
	w, gate := r.start(t, time.Millisecond)
	gate.answered(http.StatusForbidden)
	w.failed(errors.New("listing or watching *v1.Service: forbidden"))
	r.waitFor(t, "more probes", func() bool { return r.probes > 5 })
	r.mu.Lock()
	recovered := r.recovered
	r.mu.Unlock()
	if recovered != 0 {
		t.Fatalf("recovery reported while the informers' requests are refused")
	}
	gate.answered(http.StatusOK)
	r.waitFor(t, "the recovery once a list is served", func() bool { return r.recovered == 1 })
}
