package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/prometheus/feature"

	// client-go's rest_client_* metrics, in the process-wide registry, as
	// kube-proxy has them.
	_ "k8s.io/component-base/metrics/prometheus/restclient"

	"github.com/kube-nftproxy/kube-nftproxy/serve"
)

// emulatedVersion is the kube-proxy release whose behaviour, flags and
// metrics kube-nftproxy follows: /statusz's "Emulation version", and the
// base of --show-hidden-metrics-for-version.
const emulatedMajor, emulatedMinor = 1, 37

// retryBindEvery is how often a server that could not bind tries again
// without --bind-address-hard-fail (kube-proxy: every 5 s).
const retryBindEvery = 5 * time.Second

// serverOptions are the metrics and health servers' flags beyond their
// addresses.
type serverOptions struct {
	profiling       bool   // --profiling: pprof on the metrics server
	showHidden      string // --show-hidden-metrics-for-version
	bindAddressHard bool   // --bind-address-hard-fail
}

func (so *serverOptions) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&so.profiling, "profiling", false, "if true, serve profiling (pprof) on the metrics server under /debug/pprof/")
	fs.StringVar(&so.showHidden, "show-hidden-metrics-for-version", "",
		fmt.Sprintf("the previous minor version (%d.%d) to show the metrics it deprecated and this one hides", emulatedMajor, emulatedMinor-1))
	fs.BoolVar(&so.bindAddressHard, "bind-address-hard-fail", false,
		"if true, failing to bind the health or metrics server's port is fatal; else it is logged and retried every 5s")
}

// validate checks --show-hidden-metrics-for-version as kube-proxy does:
// empty or the previous minor version.
func (so *serverOptions) validate() error {
	want := fmt.Sprintf("%d.%d", emulatedMajor, emulatedMinor-1)
	if so.showHidden != "" && so.showHidden != want {
		return fmt.Errorf("--show-hidden-metrics-for-version %q: must be omitted or have the value '%s'; only the previous minor version is allowed", so.showHidden, want)
	}
	return nil
}

// serverFields are the config fields of serverOptions.
func serverFields() []configField {
	type c = kubeProxyConfig
	return []configField{
		same("profiling", func(o *options) *bool { return &o.servers.profiling }, func(c *c) *bool { return &c.EnableProfiling }),
		same("show-hidden-metrics-for-version", func(o *options) *string { return &o.servers.showHidden },
			func(c *c) *string { return &c.ShowHiddenMetricsForVersion }),
		same("bind-address-hard-fail", func(o *options) *bool { return &o.servers.bindAddressHard }, func(c *c) *bool { return &c.BindAddressHardFail }),
	}
}

// processMetrics fills the process-wide registry that /metrics serves
// besides serve.Metrics' own: kubernetes_build_info and
// kubernetes_feature_enabled (component-base's Go and process collectors
// and meta metrics, and client-go's adapter, register themselves).
var processMetrics = sync.OnceFunc(func() {
	info := metrics.NewGaugeVec(&metrics.GaugeOpts{
		Name:           "kubernetes_build_info",
		Help:           "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
		StabilityLevel: metrics.BETA,
	}, []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"})
	legacyregistry.MustRegister(info)
	bi := buildInfo()
	info.WithLabelValues(bi.Major, bi.Minor, bi.GitVersion, bi.GitCommit, bi.GitTreeState, bi.BuildDate,
		bi.GoVersion, bi.Compiler, bi.Platform).Set(1)
})

// recordFeatureGates sets kubernetes_feature_enabled for the gates we
// know, as kube-proxy does for its own (given or defaulted).
func recordFeatureGates(ctx context.Context, given map[string]bool) {
	for name, g := range knownGates {
		on := g.def
		if v, ok := given[name]; ok {
			on = v
		}
		feature.RecordFeatureInfo(ctx, name, g.stage, on)
	}
}

// knownGates are the feature gates kube-nftproxy acts on, with
// kube-proxy v1.37's stages and defaults.
var knownGates = map[string]struct {
	stage string
	def   bool
}{
	"ComponentFlagz":      {"BETA", true},
	"ComponentStatusz":    {"BETA", true},
	"LoggingAlphaOptions": {"ALPHA", false},
	"LoggingBetaOptions":  {"BETA", true},
}

// gateOn is a known gate's value: given, else its default.
func gateOn(gates map[string]bool, name string) bool {
	if v, ok := gates[name]; ok {
		return v
	}
	return knownGates[name].def
}

// metricsMux is the metrics server's: /metrics and /proxyMode, /healthz
// (a plain "ok": the process answers), /configz, and as kube-proxy with
// its gates on, /flagz and /statusz; with --profiling, /debug/pprof/.
func (s *proxyServer) metricsMux(gates map[string]bool) *http.ServeMux {
	mux := http.NewServeMux()
	s.metrics.Register(mux, s.o.modeName())
	paths := []string{"/metrics", "/proxyMode", "/healthz", "/configz"}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/configz", s.serveConfigz)
	if gateOn(gates, "ComponentFlagz") {
		mux.HandleFunc("/flagz", s.serveFlagz)
		paths = append(paths, "/flagz")
	}
	if s.o.servers.profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		paths = append(paths, "/debug/pprof")
	}
	if gateOn(gates, "ComponentStatusz") {
		started := time.Now()
		sort.Strings(paths)
		mux.HandleFunc("/statusz", func(w http.ResponseWriter, _ *http.Request) { serveStatusz(w, started, paths) })
	}
	return mux
}

// zpageHeader starts /flagz and /statusz as kube-proxy's: the component's
// name and the warning that the page is not an API (then, on /statusz
// only, an empty line).
func zpageHeader(w http.ResponseWriter, page, after string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fmt.Fprintf(w, "\nkube-nftproxy %s\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n%s", page, after)
}

// serveFlagz lists every flag and its effective value, name=value, by
// name.
func (s *proxyServer) serveFlagz(w http.ResponseWriter, _ *http.Request) {
	zpageHeader(w, "flagz", "")
	if s.o.flags == nil {
		return
	}
	var names []string
	s.o.flags.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "%s=%s\n", n, s.o.flags.Lookup(n).Value.String())
	}
}

// serveStatusz says when the process started, its versions and the
// metrics server's paths.
func serveStatusz(w http.ResponseWriter, started time.Time, paths []string) {
	zpageHeader(w, "statusz", "\n")
	up := time.Since(started)
	rel, _ := buildVersion()
	fmt.Fprintf(w, "Started  %s\n", started.Format(time.UnixDate))
	fmt.Fprintf(w, "Up  %d hr %02d min %02d sec\n", int(up.Hours()), int(up.Minutes())%60, int(up.Seconds())%60)
	fmt.Fprintf(w, "Go version  %s\n", runtime.Version())
	fmt.Fprintf(w, "Binary version  %s\n", rel)
	fmt.Fprintf(w, "Emulation version  %d.%d\n", emulatedMajor, emulatedMinor)
	fmt.Fprintf(w, "Paths  %s\n", strings.Join(paths, " "))
}

// serveConfigz is the effective KubeProxyConfiguration as kube-proxy's
// /configz shows it: JSON, under the key of its API group.
func (s *proxyServer) serveConfigz(w http.ResponseWriter, _ *http.Request) {
	c := kubeProxyConfig{TypeMeta: metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind}}
	for _, f := range configFields() {
		f.store(s.o, &c)
	}
	c.Logging = s.o.logging
	out, err := json.Marshal(map[string]any{"kubeproxy.config.k8s.io": c})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(out)
}

// bindServer serves h on addr until ctx ends; an empty address disables
// it. A port that cannot be bound is fatal with hardFail (the error is
// returned), else logged and tried again every retryBindEvery, as
// kube-proxy does without --bind-address-hard-fail.
func bindServer(ctx context.Context, log *slog.Logger, guard *serve.ConnGuard, what, addr string, h http.Handler, hardFail bool) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		serveOn(ctx, log, guard, what, ln, h)
		return nil
	}
	err = fmt.Errorf("%s server on %s: %w", what, addr, err)
	if hardFail {
		return fmt.Errorf("%w (--bind-address-hard-fail)", err)
	}
	log.Error("could not start the "+what+" server; retrying every "+retryBindEvery.String(), "err", err)
	go tickUntil(ctx, retryBindEvery, func() bool {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			serveOn(ctx, log, guard, what, ln, h)
		}
		return err == nil
	})
	return nil
}

func serveOn(ctx context.Context, log *slog.Logger, guard *serve.ConnGuard, what string, ln net.Listener, h http.Handler) {
	guard.NewServer(what, h).ServeUntil(ctx, ln, log)
	l := guard.Limits()
	log.Info(what+" server listening", "address", ln.Addr().String(),
		"idle_timeout", l.IdleTimeout, "max_conns", l.MaxConnsPerServer, "max_conns_all_servers", l.MaxConns)
}

// showHiddenMetrics applies --show-hidden-metrics-for-version (validated).
func (so *serverOptions) showHiddenMetrics() {
	if so.showHidden != "" {
		metrics.SetShowHidden()
	}
}
