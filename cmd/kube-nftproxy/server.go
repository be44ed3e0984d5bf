package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/internal/instance"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
	"github.com/kube-nftproxy/kube-nftproxy/source/apisource"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// proxyServer is the running proxy. runProxy builds it in order: the
// checks and the source's client or files (prepare), the kernel handles
// (openKernel), the mode's backend, the sync loop, health and metrics
// (observe) and their servers (serve); then run starts the source and the
// loop. What a step opened is closed, last first, when runProxy returns.
type proxyServer struct {
	o                         *options
	log                       *slog.Logger
	cfg                       nft.Config
	mode                      string // modeNFTables or modeIPVS
	node                      string
	minSyncPeriod, syncPeriod time.Duration
	memCeiling                int64 // the soft memory limit set from the cgroup's (0: none)

	ipvsConn *ipvsnl.Conn // IPVS mode only
	sysctls  nodeSysctls
	kernel   *nftlib.Kernel
	upstream *upstreamCleanup
	backend  *modeBackend
	loop     *proxier.Loop
	health   *serve.Health
	metrics  *serve.Metrics
	source   stateSource

	closers []func()
}

func runProxy(ctx context.Context, o *options, log *slog.Logger) error {
	s := &proxyServer{o: o, log: log}
	defer s.close()
	for _, step := range []func(context.Context) error{
		s.prepare, s.openKernel, s.buildBackend, s.buildLoop, s.observe, s.serve,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return s.run(ctx)
}

// onClose adds what close undoes.
func (s *proxyServer) onClose(f func()) { s.closers = append(s.closers, f) }

func (s *proxyServer) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// prepare checks the settings and opens what can fail on bad input before
// anything on the node is touched: IPVS, the API client, the state files.
// The API source starts reading here: its listing overlaps the steps that
// follow, and nothing is synced before run connects it to the loop.
func (s *proxyServer) prepare(ctx context.Context) error {
	cfg, err := s.o.nftConfig()
	if err != nil {
		return err
	}
	s.cfg = cfg
	applyOOMScoreAdj(oomScoreAdjPath, s.o.oomScoreAdj, s.log)
	s.memCeiling = setCgroupMemoryLimit(os.DirFS("/"), os.Getenv("GOMEMLIMIT"), s.log)
	s.minSyncPeriod, s.syncPeriod = s.o.periods()
	s.mode = modeNFTables
	if s.o.proxyMode == modeIPVS {
		s.mode = modeIPVS
		// Before anything else: a kernel without IPVS is a clear error.
		if s.ipvsConn, err = openIPVS(); err != nil {
			return err
		}
		s.onClose(func() { s.ipvsConn.Close() })
		if _, err := ipvsPlanConfig(s.o, cfg); err != nil {
			return err
		}
	}
	if s.node, err = s.o.nodeName(); err != nil {
		return err
	}
	if s.source, err = newStateSource(s.o, s.node, s.log); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	s.onClose(cancel) // a step that fails stops the source again
	s.source.begin(ctx, s)
	return nil
}

// openKernel takes the namespace's instance lock, tunes conntrack, opens
// nftables and checks that it has what we program.
func (s *proxyServer) openKernel(context.Context) error {
	// One instance per network namespace: two would rewrite each other's
	// tables at every sync.
	lock, err := instance.Acquire()
	if errors.Is(err, instance.ErrRunning) {
		return fmt.Errorf("%w; stop it first", err)
	}
	if err != nil {
		return needPrivileges("taking the instance lock", err)
	}
	if lock.Squatted != "" {
		s.log.Warn(lock.Squatted)
	}
	// Said once the lock is ours: a refused second instance says only why.
	s.o.noteMode(s.o.flags, s.log)
	s.onClose(func() { lock.Release() })
	// kube-proxy's conntrack sysctls, once, before the first sync. A key
	// that is missing or read-only here is a warning; other errors stop us.
	if _, err := s.sysctls.tuner(s.log).Apply(s.o.conntrackTuning()); err != nil {
		return fmt.Errorf("could not set conntrack parameters: %w", err)
	}
	if s.cfg, err = ensureRouteLocalnet(s.sysctls.proc(), s.cfg, s.log); err != nil {
		return err
	}
	k, err := nftlib.OpenKernel("")
	if err != nil {
		return needPrivileges("opening nftables", err)
	}
	s.kernel = k
	s.onClose(func() { k.Close() })
	// Fail now, not at every sync, when nftables cannot be used here.
	if _, err := k.Generation(); err != nil {
		return needPrivileges("talking to nftables", err)
	}
	// A kernel without something we program fails here, naming it, rather
	// than at every sync (probed, never read from the version string).
	if err := k.ProbeFeatures(s.mode == modeIPVS); err != nil {
		var missing *nftlib.MissingFeatureError
		if errors.As(err, &missing) {
			return fmt.Errorf("%w; kube-nftproxy needs Linux %s or later with nf_tables and its expression modules", err, nftlib.MinKernel)
		}
		return err
	}
	return nil
}

func (s *proxyServer) buildBackend(ctx context.Context) error {
	b, err := s.newBackend(ctx, s.mode)
	s.backend = b
	if err == nil {
		s.sysctls.record(s.kernel, s.log) // every sysctl is set by now
	}
	return err
}

// modeBackend is a mode's backend and how it is wired to the server.
type modeBackend struct {
	proxier.Backend
	hooks *backendHooks
}

// wire connects the backend to the loop (repairs of another process's
// changes, syncs at the times it asks for) and to drift accounting.
func (m *modeBackend) wire(loop *proxier.Loop, onDrift func(table string, diffs []string)) {
	m.hooks.syncAt, m.hooks.changed, m.hooks.drift = loop.SyncAt, loop.Repair, onDrift
}

// backendHooks pass a backend's calls on to the loop and to drift
// accounting, which exist only once the loop and health do: wire sets
// them before the first Sync, which is when the backend starts calling.
type backendHooks struct {
	syncAt  func(time.Time)
	changed func()
	drift   func(table string, diffs []string)
	// others is the change monitor's signal of other processes' nftables
	// changes (nftlib.Kernel.OtherChanges), once the backend opened it.
	others func() <-chan struct{}
}

// OtherChanges is the change monitor's signal of other processes'
// nftables changes; nil when there is none.
func (h *backendHooks) OtherChanges() <-chan struct{} {
	if h.others == nil {
		return nil
	}
	return h.others()
}

// SyncAt asks the loop for a sync at t (IPVS: draining real servers).
func (h *backendHooks) SyncAt(t time.Time) {
	if h.syncAt != nil {
		h.syncAt(t)
	}
}

// Changed asks for a sync now: another process changed our tables.
func (h *backendHooks) Changed() {
	if h.changed != nil {
		h.changed()
	}
}

// Drift counts a repair of what another process changed.
func (h *backendHooks) Drift(table string, diffs []string) {
	if h.drift != nil {
		h.drift(table, diffs)
	}
}

// newBackend builds the backend of mode over the kernel handles.
func (s *proxyServer) newBackend(ctx context.Context, mode string) (*modeBackend, error) {
	hooks := &backendHooks{}
	if mode == modeIPVS {
		b, err := newIPVSBackend(s.o, s.cfg, s.kernel, s.ipvsConn, s.sysctls.proc(), s.log, hooks)
		if err != nil {
			return nil, err
		}
		s.removeNFTablesMode(ctx)
		return &modeBackend{Backend: &leanFirstSync{Backend: b}, hooks: hooks}, nil
	}
	b, err := nft.NewBackend(s.kernel, nft.BackendConfig{Rules: s.cfg, Log: s.log, CheckEvery: s.syncPeriod,
		OnForeignChange: hooks.Changed, OnDrift: hooks.Drift,
		Strategy: nft.Strategy{OnLargeTx: largeTxMemory, OnLargeTxRound: debug.FreeOSMemory, DeferSettle: true}})
	if err != nil {
		return nil, err
	}
	hooks.others = s.kernel.OtherChanges
	return &modeBackend{Backend: b, hooks: hooks}, nil
}

// removeNFTablesMode removes nftables mode's tables in IPVS mode: they
// would DNAT before IPVS sees a packet.
func (s *proxyServer) removeNFTablesMode(ctx context.Context) {
	nb, err := nft.NewBackend(s.kernel, nft.BackendConfig{Rules: s.cfg, Log: s.log})
	if err != nil {
		return
	}
	if removed, err := nb.Cleanup(ctx); err != nil {
		s.log.Warn("could not remove nftables mode's tables", "err", err)
	} else if removed {
		s.log.Info("removed nftables mode's tables")
	}
}

func (s *proxyServer) buildLoop(context.Context) error {
	s.loop = proxier.NewLoop(s.backend.Backend, s.log)
	s.loop.MinSyncPeriod, s.loop.SyncPeriod = s.minSyncPeriod, s.syncPeriod
	return nil
}

// observe creates the health and metrics the loop and the backend report to.
func (s *proxyServer) observe(ctx context.Context) error {
	s.health = serve.NewHealth(2 * s.syncPeriod) // kube-proxy's healthz timeout
	s.health.FailTimeout = s.syncPeriod
	s.metrics = serve.NewModeMetrics(s.o.modeName())
	// kube-proxy's leftovers go after our first sync (afterSync below).
	s.upstream = newUpstreamCleanup(s.mode == modeIPVS, s.log, s.metrics)
	s.upstream.changes = s.backend.hooks.OtherChanges
	s.health.Answered = s.metrics.CountProbe
	s.loop.OnQueued = func() {
		s.health.Queued()
		s.metrics.Queued()
	}
	s.backend.wire(s.loop, func(table string, _ []string) { // the backend logs what differed
		s.health.Drifted()
		s.metrics.DriftRepairs.WithLabelValues(table).Inc()
	})
	var first sync.Once
	gc := &idleGC{ceiling: s.memCeiling}
	pressure := &memoryPressure{ceiling: s.memCeiling}
	s.loop.OnSync = func(res proxier.SyncResult, took time.Duration, err error) {
		s.metrics.Observe(res, took, err)
		gc.synced(res.Changed || err != nil)
		pressure.synced(heapLive(), s.log)
		if err == nil {
			// The first full sync's garbage (the encoded transaction's
			// heap part, the build's scratch) is the most the proxy
			// ever frees at once: handed back to the kernel now rather
			// than as the scavenger gets to it, minutes later.
			first.Do(func() { go debug.FreeOSMemory() })
			s.upstream.afterSync(ctx)
			s.health.Updated()
		} else if s.health.SyncFailed() {
			s.log.Warn("syncs have failed for longer than the sync period: the kernel does not hold the rules it should; /readyz fails until a sync succeeds",
				"syncPeriod", s.syncPeriod, "err", err)
		}
	}
	return nil
}

// serve opens the health check node ports, the conntrack cleanup after
// each sync, the conntrack table's watch, and the health and metrics
// servers.
func (s *proxyServer) serve(ctx context.Context) error {
	// Health check node ports of externalTrafficPolicy Local Services,
	// on the node's addresses, as kube-proxy.
	// Every HTTP server's connections are counted and capped together,
	// far below the open file limit.
	guard := serve.NewConnGuard(serve.DefaultLimits(), s.log)
	guard.OnDropped = s.metrics.CountDroppedConn
	hc := &serve.HealthChecks{Log: s.log, Healthy: s.health.Healthy, Addrs: nodePortAddrs(s.cfg), Guard: guard}
	s.onClose(func() { hc.Close(ctx) })
	cleanConntrack, err := conntrackCleaner(s.o, s.syncPeriod, s.log, s.metrics)
	if err != nil {
		return err
	}
	syncLocal, closeLocal := localNodePorts(localhostFamilies(s.o.modeName(), s.o.gates, s.cfg), s.metrics, s.log)
	if closeLocal != nil {
		s.onClose(closeLocal)
	}
	s.loop.OnApplied = func(st *model.State) {
		if syncLocal != nil {
			syncLocal(st)
		}
		hc.Update(st)
		s.metrics.CountNoLocalEndpoints(st)
		cleanConntrack(st)
	}
	// The conntrack table's fill: gauges, and a warning when it nears
	// the limit at which the kernel drops new connections.
	go conntrack.NewPressure(s.log, s.metrics.Registry).Run(ctx, conntrack.PressureEvery)
	processMetrics()
	recordFeatureGates(ctx, s.o.gates)
	s.o.servers.showHiddenMetrics()
	hard := s.o.servers.bindAddressHard
	if err := bindServer(ctx, s.log, guard, "health", s.o.healthzAddress, s.health.Handler(), hard); err != nil {
		return err
	}
	return bindServer(ctx, s.log, guard, "metrics", s.o.metricsAddress, s.metricsMux(s.o.gates), hard)
}

// run starts the source and runs the sync loop until ctx ends.
func (s *proxyServer) run(ctx context.Context) error {
	s.source.start(ctx, s)
	return runLoop(ctx, s.loop, s.log)
}

// stateSource is where the loop's states come from: the API server or
// the state files.
type stateSource interface {
	// begin starts reading what can be read before the loop exists (the
	// API server's listing); what it learns waits for start.
	begin(ctx context.Context, s *proxyServer)
	// start connects the source to the server's loop, health and metrics,
	// starts it, and logs that the proxy runs.
	start(ctx context.Context, s *proxyServer)
}

// newStateSource opens the source the options ask for: the state files
// with --state, else the API server.
func newStateSource(o *options, node string, log *slog.Logger) (stateSource, error) {
	if o.statePath == "" {
		client, err := o.apiClient()
		if err != nil {
			return nil, err
		}
		return &apiStateSource{client: client, opts: modelOptions(o.gates, log)}, nil
	}
	files, err := filesource.NewFileSource(o.statePath, node, log, modelOptions(o.gates, log)...)
	if err != nil {
		return nil, fmt.Errorf("--state: %w", err)
	}
	return &fileStateSource{files: files}, nil
}

type apiStateSource struct {
	client  kubernetes.Interface
	opts    []kube.Option // the Builder's
	builder *kube.Builder
	early   earlySource
}

// begin starts the informers: the TLS handshake, the lists and their
// decoding overlap the kernel's set-up. The Builder fills meanwhile; the
// loop takes no State from it before start has wired it and it is ready.
func (a *apiStateSource) begin(ctx context.Context, s *proxyServer) {
	a.builder = kube.NewBuilder(s.node, a.opts...)
	src := &apisource.APISource{Client: a.client, Builder: a.builder, Log: s.log, OnChange: a.early.changed,
		OnReady: a.early.readyNow, OnError: a.early.failing, OnRecovered: a.early.ok,
		ResyncPeriod: s.o.configSyncPeriod, // --config-sync-period
		// One small request per sync period notices a server gone
		// silent (hung, or its packets dropped) within that period.
		ProbeEvery: s.syncPeriod}
	go func() {
		if err := src.Run(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("API source stopped", "err", err)
		}
	}()
}

func (a *apiStateSource) start(ctx context.Context, s *proxyServer) {
	b := a.builder
	s.metrics.CountChanges(b.ChangeCounts)
	s.loop.SetSource(func() *model.State {
		st, triggers := b.StateWithFamilyTriggers()
		s.metrics.Syncing(triggers) // observed by OnSync's metrics.Observe if the sync succeeds
		s.health.SetNodeEligible(!st.Node.Leaving)
		return st
	})
	// Each informer retries with its own URL in the error: one failure.
	status := serve.NewSourceStatus("api", s.log, s.syncPeriod, s.health, s.metrics).AnyText()
	a.early.wire(sourceCallbacks{changed: s.loop.Changed, failing: status.Failing, ok: status.OK,
		ready: func() {
			// The first listing's decoded objects are garbage now (the
			// caches keep slimmed copies): a collection before the first
			// sync bases the heap's goal on what stays, not on them, so
			// the sync's garbage does not add to their peak. In the
			// background: the sync need not wait for it.
			go runtime.GC()
			s.loop.SourceReady()
		}})
	s.log.Info("kube-nftproxy running; nothing is programmed before the API server's first complete listing",
		"source", "API server", "node", s.node, "mode", s.o.modeName())
	// kube-proxy's event on its Node, at the same point: set up, the
	// informers started, before the first sync.
	events := startNodeEvents(ctx, a.client, s.node, s.log)
	s.onClose(events.stop)
	events.starting()
}

type fileStateSource struct{ files *filesource.FileSource }

// begin does nothing: the files are read once the loop runs.
func (f *fileStateSource) begin(context.Context, *proxyServer) {}

func (f *fileStateSource) start(ctx context.Context, s *proxyServer) {
	f.files.OnState = s.loop.SetState
	// A file that could not be read is retried as a failed sync is.
	f.files.RetryMin, f.files.RetryMax = s.minSyncPeriod, s.syncPeriod
	status := serve.NewSourceStatus("file", s.log, s.syncPeriod, s.health, s.metrics)
	f.files.OnError, f.files.OnRecovered = status.Failing, status.OK
	go func() {
		if err := f.files.Run(ctx); err != nil {
			s.log.Error("watching the state stopped; changes are no longer followed", "err", err)
		}
	}()
	s.log.Info("kube-nftproxy running", "state", s.o.statePath, "node", s.node, "mode", s.o.modeName())
}
