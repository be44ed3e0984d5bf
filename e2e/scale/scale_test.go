package scale

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// The fill's addresses: the 256+i-th of the range, none outside it.
func TestStaticClusterIP(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		i      int
		want   string
	}{
		{"10.96.0.0/16", 0, "10.96.1.0"},
		{"10.96.0.0/16", 44000, "10.96.172.224"},
		{"10.96.0.0/16", 65279, "10.96.255.255"},
		{"10.96.0.0/16", 65280, "invalid IP"},
		{"10.96.0.0/15", 99999, "10.97.135.159"},
		{"10.96.7.0/15", 0, "10.96.1.0"},
		{"", 0, "invalid IP"},
		{"fd00:10:96::/112", 0, "invalid IP"},
	} {
		var prefix netip.Prefix
		if tc.prefix != "" {
			prefix = netip.MustParsePrefix(tc.prefix)
		}
		if got := StaticClusterIP(prefix, tc.i).String(); got != tc.want {
			t.Errorf("StaticClusterIP(%s, %d) = %s, want %s", tc.prefix, tc.i, got, tc.want)
		}
	}
}

// A Service asks for its address; when another took it, the API server
// picks one; any other refusal is the caller's.
func TestCreateServiceAsksForItsAddress(t *testing.T) {
	taken := `{"message":"spec.clusterIPs: Invalid value: []string{\"10.96.1.0\"}: failed to allocate IP 10.96.1.0: provided IP is already allocated"}`
	for _, tc := range []struct {
		name    string
		answers []string // "code body" in turn: 201, or 422 taken, ...
		asked   []bool   // whether each request asked for an address
		ok      bool
	}{
		{"granted", []string{"201"}, []bool{true}, true},
		{"taken, then picked", []string{"422 taken", "201"}, []bool{true, false}, true},
		{"taken, and the name too", []string{"422 taken", "409"}, []bool{true, false}, true},
		{"invalid", []string{"422"}, []bool{true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []bool
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var svc corev1.Service
				_ = json.NewDecoder(r.Body).Decode(&svc)
				asked = append(asked, svc.Spec.ClusterIP != "")
				code, body, _ := strings.Cut(tc.answers[min(len(asked), len(tc.answers))-1], " ")
				w.WriteHeader(map[string]int{"201": 201, "409": 409, "422": 422}[code])
				if body == "taken" {
					_, _ = w.Write([]byte(taken))
				}
			}))
			defer srv.Close()
			c := &Client{URL: srv.URL, http: srv.Client(), retryUnit: time.Millisecond}
			err := createService(context.Background(), c, Service(0, false), netip.MustParseAddr("10.96.1.0"))
			if !slices.Equal(asked, tc.asked) || (err == nil) != tc.ok {
				t.Errorf("requests asking for the address %v, err %v; want %v, success %v", asked, err, tc.asked, tc.ok)
			}
		})
	}
}
