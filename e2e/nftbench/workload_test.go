package nftbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
)

// serviceEvery makes every serviceEvery-th change of the latency workload
// a Service created; the others replace an endpoint.
const serviceEvery = 5

// maxInFlight bounds the workload's writes in flight: past it a change is
// skipped (and counted) rather than queued behind a stalled API server.
const maxInFlight = 32

// workload writes the latency benchmark's changes at a fixed rate: every
// endpoint it writes and every ClusterIP it asks for is new, so each
// change's address first shows in a node's kernel when that change is
// programmed there. It lives as long as the bench: its Services and
// addresses go on across the proxy kinds' runs.
type workload struct {
	api      *scale.Client
	services int // the seeded Services: scale.Name(0..services-1)
	per      int
	rng      *rand.Rand

	mu        sync.Mutex
	endpoints map[int][]netip.Addr // the seeded Services changed so far
	busy      map[int]bool         // a write to its slice in flight
	nextIP    uint32               // fresh endpoint addresses from 100.112.0.0
	nextVIP   uint32               // ClusterIPs asked for, down from 10.96.255.254
	created   int                  // Services the workload created
	skipped   int
	errs      []error
}

func newWorkload(api *scale.Client, services, per int) *workload {
	return &workload{api: api, services: services, per: per, rng: rand.New(rand.NewPCG(1, 2)),
		endpoints: map[int][]netip.Addr{}, busy: map[int]bool{}}
}

// run writes one change every 1/rate for window, registering each in
// want, and returns when the last write has returned. Change k is due at
// k/rate from the start: a late one (the machine busy) is written at
// once, so the count holds.
func (w *workload) run(ctx context.Context, want *awaited, rate float64, window time.Duration) {
	start := time.Now()
	total := int(window.Seconds() * rate)
	var wg sync.WaitGroup
	inflight := make(chan struct{}, maxInFlight)
	for k := range total {
		due := start.Add(time.Duration(float64(k) * float64(time.Second) / rate))
		if pause(ctx, time.Until(due)) != nil {
			break
		}
		select {
		case inflight <- struct{}{}:
		default:
			w.mu.Lock()
			w.skipped++
			w.mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-inflight }()
			var err error
			if k%serviceEvery == serviceEvery-1 {
				err = w.createService(ctx, want)
			} else {
				err = w.replaceEndpoint(ctx, want)
			}
			if err != nil {
				w.mu.Lock()
				w.errs = append(w.errs, err)
				w.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// freshIP is a new endpoint address (100.112.0.0/12: beyond the seeded
// endpoints of scale.EndpointAddr up to a million). Call with mu held.
func (w *workload) freshIP() netip.Addr {
	n := w.nextIP
	w.nextIP++
	return netip.AddrFrom4([4]byte{100, 112 + byte(n>>16), byte(n >> 8), byte(n)})
}

// triggered sets es's last-change-trigger-time to at, as the endpoint
// controllers do, so that the proxies' network programming histograms
// time the same change as the harness.
func triggered(es *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.UTC().Format(time.RFC3339Nano)}
	return es
}

// replaceEndpoint replaces one endpoint of a random seeded Service (none
// with a write in flight) with a fresh address. The slice is written
// whole, without a resourceVersion: the workload is its only writer and
// knows its content, so no read precedes the write.
func (w *workload) replaceEndpoint(ctx context.Context, want *awaited) error {
	w.mu.Lock()
	i := w.rng.IntN(w.services)
	for w.busy[i] {
		i = w.rng.IntN(w.services)
	}
	w.busy[i] = true
	addrs, ok := w.endpoints[i]
	if !ok {
		addrs = make([]netip.Addr, w.per)
		for j := range addrs {
			addrs[j] = scale.EndpointAddr(i, j, w.per)
		}
	}
	addrs = append([]netip.Addr(nil), addrs...)
	ip := w.freshIP()
	addrs[w.rng.IntN(w.per)] = ip
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.busy, i)
		w.mu.Unlock()
	}()
	c := want.add(false, ip)
	es := scale.SliceOf(scale.Name(i), addrs, nodeName)
	at := want.start(c)
	if err := w.api.Do(ctx, http.MethodPut, scale.SlicesPath+"/"+es.Name, triggered(es, at), nil); err != nil {
		want.fail(c)
		return fmt.Errorf("replacing an endpoint of %s: %w", scale.Name(i), err)
	}
	want.finish(c)
	w.mu.Lock()
	w.endpoints[i] = addrs
	w.mu.Unlock()
	return nil
}

// createService creates a new Service with one fresh endpoint: its slice
// first, then the Service, whose write is the change timed. The harness
// picks the ClusterIP so that it is awaited before the write; one already
// taken is refused and the next one tried.
func (w *workload) createService(ctx context.Context, want *awaited) error {
	w.mu.Lock()
	name := fmt.Sprintf("knp-lat-%05d", w.created)
	w.created++
	ep := w.freshIP()
	w.mu.Unlock()
	if err := scale.CreateSlice(ctx, w.api, triggered(scale.SliceOf(name, []netip.Addr{ep}, nodeName), time.Now())); err != nil {
		return fmt.Errorf("creating %s's slice: %w", name, err)
	}
	for range 20 {
		w.mu.Lock()
		n := w.nextVIP
		w.nextVIP++
		w.mu.Unlock()
		vip := netip.AddrFrom4([4]byte{10, 96, 255 - byte(n>>8), 254 - byte(n)})
		svc := scale.ServiceNamed(name, false)
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = vip.String(), []string{vip.String()}
		c := want.add(true, vip)
		want.start(c)
		err := w.api.Do(ctx, http.MethodPost, scale.ServicesPath, svc, nil)
		if err == nil {
			want.finish(c)
			return nil
		}
		want.fail(c)
		var se *scale.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusUnprocessableEntity || !strings.Contains(se.Body, "allocated") {
			return fmt.Errorf("creating %s: %w", name, err)
		}
	}
	return fmt.Errorf("creating %s: 20 ClusterIPs in a row already allocated", name)
}

// outcome is what the workload could not do.
func (w *workload) outcome() (skipped int, errs []error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	skipped, errs = w.skipped, w.errs
	w.skipped, w.errs = 0, nil
	return skipped, errs
}
