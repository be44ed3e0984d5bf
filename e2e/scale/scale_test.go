package scale

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestCreateRetrying answers a sequence of status codes to POSTs and
// checks how many requests createRetrying sends and what it returns.
func TestCreateRetrying(t *testing.T) {
	for _, tc := range []struct {
		name     string
		codes    []int // answered in turn; the last one from then on
		requests int
		ok       bool
		body     string
	}{
		{"created", []int{201}, 1, true, ""},
		{"etcd timed out, then created", []int{504, 201}, 2, true, ""},
		{"timed out but carried out", []int{500, 409}, 2, true, ""},
		{"already there at once", []int{409}, 1, false, ""},
		{"bad request", []int{400}, 1, false, ""},
		{"throttled, then created", []int{429, 201}, 2, true, ""},
		{"never recovers", []int{503}, 6, false, ""},
		{"IP allocation timed out in etcd", []int{422, 201}, 2, true, `{"message":"failed to allocate IP: etcdserver: request timed out"}`},
		{"invalid", []int{422}, 1, false, `{"message":"spec.ports: Required value"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := int(n.Add(1)) - 1
				w.WriteHeader(tc.codes[min(i, len(tc.codes)-1)])
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c := &Client{URL: srv.URL, http: srv.Client(), retryUnit: time.Millisecond}
			err := createRetrying(context.Background(), c, ServicesPath, Service(0, false))
			if got := int(n.Load()); got != tc.requests || (err == nil) != tc.ok {
				t.Errorf("%d requests, err %v; want %d requests, success %v", got, err, tc.requests, tc.ok)
			}
		})
	}
}
