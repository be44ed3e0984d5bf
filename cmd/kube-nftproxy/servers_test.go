package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/serve"
)

// A port that is taken: fatal with --bind-address-hard-fail; without it,
// logged and served once free (kube-proxy retries every 5 s).
func TestBindAddressHardFail(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := taken.Addr().String()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	guard := serve.NewConnGuard(serve.DefaultLimits(), log)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("up")) })
	if err := bindServer(ctx, log, guard, "metrics", addr, ok, true); err == nil || !strings.Contains(err.Error(), "--bind-address-hard-fail") {
		t.Fatalf("hard fail: err %v, want the bind error", err)
	}
	if err := bindServer(ctx, log, guard, "metrics", addr, ok, false); err != nil {
		t.Fatalf("soft fail: err %v, want nil (logged, retried)", err)
	}
	taken.Close()
	deadline := time.Now().Add(3 * retryBindEvery)
	for {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) == "up" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never came up on %s once it was free: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The metrics server's paths: pprof only with --profiling, /flagz and
// /statusz unless their gates are off.
func TestMetricsMuxPaths(t *testing.T) {
	tests := []struct {
		name      string
		profiling bool
		gates     map[string]bool
		want      map[string]int
	}{
		{"defaults", false, nil, map[string]int{"/metrics": 200, "/proxyMode": 200, "/healthz": 200, "/configz": 200,
			"/flagz": 200, "/statusz": 200, "/debug/pprof/": 404}},
		{"profiling", true, nil, map[string]int{"/debug/pprof/": 200, "/debug/pprof/cmdline": 200}},
		{"gates off", false, map[string]bool{"ComponentFlagz": false, "ComponentStatusz": false}, map[string]int{"/flagz": 404, "/statusz": 404}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := &options{proxyMode: modeNFTables, servers: serverOptions{profiling: tc.profiling}}
			s := &proxyServer{o: o, metrics: serve.NewMetrics()}
			mux := s.metricsMux(tc.gates)
			for path, want := range tc.want {
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != want {
					t.Errorf("%s: %d, want %d", path, rec.Code, want)
				}
			}
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
			if !strings.HasPrefix(rec.Body.String(), `{"kubeproxy.config.k8s.io":{"kind":"KubeProxyConfiguration"`) {
				t.Errorf("/configz: %s", rec.Body.String())
			}
		})
	}
}
