package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/internal/instance"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/loglevel"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
	"github.com/kube-nftproxy/kube-nftproxy/source/apisource"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// options are the flags shared by the proxy and `render`, with kube-proxy's
// names and defaults.
type options struct {
	statePath        string
	hostnameOverride string
	clusterCIDR      string
	masqueradeAll    bool
	masqueradeBit    int
	tcpBeLiberal     bool
	detectLocalMode  string
	bridgeInterface  string
	ifacePrefix      string
	nodePortAddrs    []string
	minSyncPeriod    time.Duration
	syncPeriod       time.Duration
	cleanup          bool
	logging          logsapi.LoggingConfiguration // kube-proxy's logging flags and config (logging.go)
	kubeconfig       string
	master           string
	apiQPS           float32
	apiBurst         int
	apiContentType   string
	healthzAddress   string
	metricsAddress   string
	configFile       string
	writeConfigTo    string
	proxyMode        string
	bindAddress      string
	featureGates     string
	oomScoreAdj      int32
	ctTuning         conntrack.TuningConfig // --conntrack-* but be-liberal, which is tcpBeLiberal
	ipvs             ipvsOptions            // --ipvs-*
	// localhostNodePorts is --iptables-localhost-nodeports (iptables mode
	// only); localhostNodePortsSet: given, as a flag or in --config.
	localhostNodePorts    bool
	localhostNodePortsSet bool
	// givenNodePortAddrs is --nodeport-addresses as given, before complete
	// fills in the mode's default (render, diff and trace try both modes).
	givenNodePortAddrs []string
	// commandFlags are render's, diff's or trace's own flags, which are
	// not settings: --config leaves them alone.
	commandFlags []string

	skipConntrackCleanup bool

	servers serverOptions  // --profiling, --show-hidden-metrics-for-version, --bind-address-hard-fail
	flags   *pflag.FlagSet // the parsed command line, for /flagz

	initOnly         bool          // --init-only
	configSyncPeriod time.Duration // --config-sync-period, configSyncPeriod
	modeDefaulted    bool          // the mode was empty: iptables, kube-proxy's default
	configData       []byte        // the --config file as loaded, to notice a change
	fileGates        map[string]bool
	gates            map[string]bool // the effective feature gates (complete)
	ignoredFlags     []ignoredFlag   // flags given that --config overrides, as kube-proxy
}

func (o *options) addRuleFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.statePath, "state", "", "read Services, EndpointSlices and Nodes from this YAML file or directory (standalone mode)")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "the name of this node (default: the hostname)")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "", "the pod CIDR(s) of the cluster, comma-separated, one per family; traffic from outside them to a ClusterIP is masqueraded")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs")
	fs.IntVar(&o.masqueradeBit, "iptables-masquerade-bit", defaultMasqueradeBit, "the bit of the fwmark space that marks packets to SNAT, 0-31")
	fs.StringVar(&o.detectLocalMode, "detect-local-mode", proxier.DetectClusterCIDR, "how to tell pod traffic from other traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	fs.StringVar(&o.bridgeInterface, "pod-bridge-interface", "", "with --detect-local-mode=BridgeInterface: the bridge the pods are on")
	fs.StringVar(&o.ifacePrefix, "pod-interface-name-prefix", "", "with --detect-local-mode=InterfaceNamePrefix: the prefix of the pods' interface names")
	fs.StringSliceVar(&o.nodePortAddrs, "nodeport-addresses", nil, "serve NodePorts only on node addresses within these CIDRs and keywords: primary (the Node object's addresses), localhost (127.0.0.0/8, ::1), all (0.0.0.0/0, ::/0) (default: primary in nftables mode, all local addresses in iptables and ipvs mode)")
	fs.BoolVar(&o.tcpBeLiberal, "conntrack-tcp-be-liberal", false, "enable liberal mode for tracking TCP packets (nf_conntrack_tcp_be_liberal=1), and do not drop forwarded packets conntrack finds invalid")
	o.addLocalhostFlag(fs)
}

// conntrackTuning is the conntrack sysctl tuning the options ask for.
func (o *options) conntrackTuning() conntrack.TuningConfig {
	t := o.ctTuning
	t.TCPBeLiberal = o.tcpBeLiberal
	return t
}

func (o *options) nodeName() (string, error) {
	if o.hostnameOverride != "" {
		return strings.ToLower(strings.TrimSpace(o.hostnameOverride)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no --hostname-override and no hostname: %w", err)
	}
	return strings.ToLower(h), nil
}

func (o *options) nftConfig() (nft.Config, error) {
	cfg := nft.DefaultConfig()
	cfg.MasqueradeAll = o.masqueradeAll
	cfg.ConntrackTCPBeLiberal = o.tcpBeLiberal
	cfg.DetectLocal = proxier.LocalDetector{Mode: o.detectLocalMode, BridgeInterface: o.bridgeInterface, InterfacePrefix: o.ifacePrefix}
	switch o.detectLocalMode {
	case proxier.DetectClusterCIDR, proxier.DetectNodeCIDR:
	case proxier.DetectBridgeInterface:
		if o.bridgeInterface == "" {
			return cfg, errors.New("--detect-local-mode=BridgeInterface needs --pod-bridge-interface")
		}
	case proxier.DetectInterfaceNamePrefix:
		if o.ifacePrefix == "" {
			return cfg, errors.New("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
		}
	default:
		return cfg, fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", o.detectLocalMode)
	}
	prefixes, primary, err := parseNodePortAddresses(o.effectiveNodePortAddrs())
	if err != nil {
		return cfg, err
	}
	cfg.NodePortAddresses, cfg.NodePortPrimary = prefixes, primary
	if o.masqueradeBit < 0 || o.masqueradeBit > 31 {
		return cfg, fmt.Errorf("--iptables-masquerade-bit %d: must be within 0-31", o.masqueradeBit)
	}
	cfg.MasqueradeBit = uint(o.masqueradeBit)
	cfg.LocalhostNodePorts = o.modeName() == modeIPTables && o.localhostNodePorts
	cfg.ClusterIPChecks = o.modeName() == modeNFTables
	seen := map[bool]bool{}
	for _, s := range strings.Split(o.clusterCIDR, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return cfg, fmt.Errorf("--cluster-cidr %q: not a CIDR (such as 10.244.0.0/16; one per IP family, comma-separated)", s)
		}
		if seen[p.Addr().Is4()] {
			return cfg, fmt.Errorf("--cluster-cidr %q: at most one CIDR per IP family", o.clusterCIDR)
		}
		seen[p.Addr().Is4()] = true
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, p.Masked())
	}
	return cfg, cfg.Validate()
}

// defaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit.
const defaultMasqueradeBit = 14

func newRootCommand() *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:   "kube-nftproxy",
		Short: "Kubernetes service proxy programming nftables over netlink (a kube-proxy drop-in)",
		Long: `kube-nftproxy programs Kubernetes Services into nftables, with kube-proxy's
flags and iptables mode's chain names, applying each change atomically.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return runRoot(cmd, o) },
	}
	fs := root.Flags()
	o.addRuleFlags(fs)
	o.addProxyFlags(fs)
	o.addLoggingFlags(root.PersistentFlags())
	root.PersistentPreRunE = startCommandLogging
	root.SetFlagErrorFunc(suggestFlag)
	addVersionFlag(root)
	root.AddCommand(newRenderCommand(), newVersionCommand(), newDiffCommand(), newTraceCommand())
	return root
}

// runRoot validates the settings (flags, then --config under them) and
// does what they ask: write the configuration, clean up, or run the proxy.
func runRoot(cmd *cobra.Command, o *options) error {
	if o.configFile != "" {
		if err := o.loadConfig(o.configFile, cmd.Flags()); err != nil {
			return err
		}
	}
	if err := o.completeHostname(cmd.Flags()); err != nil {
		return err
	}
	if err := o.complete(); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	o.flags = cmd.Flags()
	log, flushLog, err := startLogging(&o.logging, o.gates, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer flushLog()
	o.noteIgnoredFlags(cmd.Flags(), log)
	o.noteGates(log)
	switch {
	case o.writeConfigTo != "":
		return o.writeConfig(o.writeConfigTo)
	case o.cleanup:
		return runCleanup(cmd.Context(), o, cmd.OutOrStdout(), log)
	case o.initOnly:
		return runInitOnly(o, log)
	}
	return runWatched(cmd.Context(), o, log)
}

// validate checks the effective settings as kube-proxy does.
func (o *options) validate() error {
	if err := checkMode(o.proxyMode); err != nil {
		return fmt.Errorf("--proxy-mode: %w", err)
	}
	if err := o.validatePeriods(); err != nil {
		return err
	}
	if err := o.checkConfigSyncPeriod(); err != nil {
		return err
	}
	if err := o.checkBindAddresses(); err != nil {
		return err
	}
	if _, err := o.nftConfig(); err != nil {
		return err
	}
	if err := o.ipvs.validate(o.proxyMode); err != nil {
		return err
	}
	if err := o.conntrackTuning().Validate(); err != nil {
		return err
	}
	if err := o.servers.validate(); err != nil {
		return err
	}
	return validateOOMScoreAdj("--oom-score-adj", o.oomScoreAdj)
}

// addProxyFlags adds the proxy command's flags but the rule flags.
func (o *options) addProxyFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.cleanup, "cleanup", false, "remove everything kube-nftproxy created and exit")
	fs.StringVar(&o.configFile, "config", "", "a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1); as in kube-proxy, it replaces every setting: the other flags given are ignored (with a warning), but for --hostname-override and the logging flags")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "write the effective configuration to this file and exit")
	fs.StringVar(&o.proxyMode, "proxy-mode", "", "the proxy mode: iptables (the default, as kube-proxy's on Linux: iptables mode's behaviour, programmed as nftables), nftables or ipvs")
	fs.StringVar(&o.bindAddress, "bind-address", "0.0.0.0", "kube-proxy's node address hint; accepted for compatibility")
	fs.Int32Var(&o.oomScoreAdj, "oom-score-adj", defaultOOMScoreAdj, "the oom_score_adj of the proxy process, within [-1000, 1000]")
	fs.StringVar(&o.featureGates, "feature-gates", "", "kube-proxy's feature gates (Name=true,...); ignored with --config, whose featureGates apply; unknown ones are refused; only LoggingAlphaOptions, LoggingBetaOptions and AllowServiceExternalIPs (false: no Service's externalIPs are programmed) have an effect, others set away from their default are warned of")
	fs.StringVar(&o.healthzAddress, "healthz-bind-address", "0.0.0.0:10256", "ip:port of the health server (/healthz, /livez); empty to disable")
	fs.StringVar(&o.metricsAddress, "metrics-bind-address", "127.0.0.1:10249", "ip:port of the metrics server (/metrics, /proxyMode); empty to disable")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig file (with neither this nor --master nor --state: the in-cluster config)")
	fs.StringVar(&o.master, "master", "", "the address of the Kubernetes API server (overrides the kubeconfig's)")
	fs.Float32Var(&o.apiQPS, "kube-api-qps", 5, "QPS to use while talking with the API server")
	fs.IntVar(&o.apiBurst, "kube-api-burst", 10, "burst to use while talking with the API server")
	fs.StringVar(&o.apiContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of requests sent to the API server")
	fs.DurationVar(&o.minSyncPeriod, "iptables-min-sync-period", time.Second, "the least time between two syncs (also the nftables one)")
	fs.DurationVar(&o.syncPeriod, "iptables-sync-period", 30*time.Second, "the most time between two syncs")
	o.ipvs.addFlags(fs)
	o.addConntrackFlags(fs)
	o.servers.addFlags(fs)
	o.addCompatFlags(fs)
	// For tests that show what goes wrong without the cleanup; not a
	// kube-proxy flag, hence hidden.
	fs.BoolVar(&o.skipConntrackCleanup, "testing-skip-conntrack-cleanup", false, "do not delete stale conntrack entries after a sync (tests only)")
	_ = fs.MarkHidden("testing-skip-conntrack-cleanup")
}

// addConntrackFlags adds the --conntrack-* flags but be-liberal, a rule flag.
func (o *options) addConntrackFlags(fs *pflag.FlagSet) {
	ct := conntrack.DefaultTuning()
	fs.Int32Var(&o.ctTuning.MaxPerCore, "conntrack-max-per-core", ct.MaxPerCore, "maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min)")
	fs.Int32Var(&o.ctTuning.Min, "conntrack-min", ct.Min, "minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is)")
	fs.DurationVar(&o.ctTuning.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout, "idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&o.ctTuning.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout, "NAT timeout for TCP connections in the CLOSE_WAIT state (0 to leave as-is)")
	fs.DurationVar(&o.ctTuning.UDPTimeout, "conntrack-udp-timeout", ct.UDPTimeout, "idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&o.ctTuning.UDPStreamTimeout, "conntrack-udp-timeout-stream", ct.UDPStreamTimeout, "idle timeout for ASSURED UDP connections (0 to leave as-is)")
}

func newRenderCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "render --state PATH",
		Short: "print the nftables ruleset for a state, in nft syntax, touching nothing (with --proxy-mode ipvs: helper tables, virtual servers, kube-ipvs0 addresses)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.statePath == "" {
				return errors.New("render needs --state")
			}
			if err := o.completeRuleCommand(cmd.Flags(), "state"); err != nil {
				return err
			}
			if err := o.ipvs.validate(o.proxyMode); err != nil {
				return err
			}
			st, err := loadState(o, klogSlog())
			if err != nil {
				return err
			}
			// A comment: the output still loads with nft -f.
			fmt.Fprintf(cmd.OutOrStdout(), "# kube-nftproxy render: mode %s\n", o.assumedMode())
			if o.proxyMode == modeIPVS {
				return renderIPVS(cmd.OutOrStdout(), o, st)
			}
			cfg, err := o.nftConfig()
			if err != nil {
				return err
			}
			return nft.Build(st, cfg).Render(cmd.OutOrStdout())
		},
	}
	o.addRuleCommandFlags(cmd.Flags(), "iptables, nftables or ipvs")
	o.ipvs.addFlags(cmd.Flags())
	return cmd
}

// loadState reads the state files, logging (not failing on) bad objects:
// they are skipped and everything else is programmed.
func loadState(o *options, log *slog.Logger) (*model.State, error) {
	node, err := o.nodeName()
	if err != nil {
		return nil, err
	}
	st, problems := filesource.LoadState(o.statePath, node, modelOptions(o.gates, log)...)
	for _, p := range problems {
		log.Warn("bad input", "err", p)
	}
	if st == nil {
		return nil, fmt.Errorf("reading state from %s failed: a file could not be read or parsed (see above)", o.statePath)
	}
	return st, nil
}

// runLoop runs the sync loop until a signal, and says so when it stops: the
// rules stay in the kernel, as kube-proxy leaves them.
func runLoop(ctx context.Context, loop *proxier.Loop, log *slog.Logger) error {
	err := loop.Run(ctx)
	log.Info("kube-nftproxy stopping; the rules stay in the kernel", "reason", context.Cause(ctx))
	return err
}

// needPrivileges explains a permission error: nftables and conntrack
// need CAP_NET_ADMIN in the network namespace.
func needPrivileges(what string, err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%s: %w (kube-nftproxy needs CAP_NET_ADMIN: run it as root or grant the capability)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// nodePortAddrs picks the addresses health check node ports listen on, as
// kube-proxy does with --nodeport-addresses: the node's addresses within
// the CIDRs, or its primary ones; nil (all addresses) without the flag.
func nodePortAddrs(cfg nft.Config) func(*model.State) []netip.Addr {
	if len(cfg.NodePortAddresses) == 0 && !cfg.NodePortPrimary {
		return nil
	}
	return func(st *model.State) []netip.Addr {
		var out []netip.Addr
		if cfg.NodePortPrimary {
			out = append(out, st.Node.IPs...)
		}
		if len(cfg.NodePortAddresses) == 0 {
			return out
		}
		local, err := netns.Addrs()
		if err != nil {
			return out
		}
		for _, a := range local {
			if !slices.Contains(out, a) && slices.ContainsFunc(cfg.NodePortAddresses, func(p netip.Prefix) bool { return p.Contains(a) }) {
				out = append(out, a)
			}
		}
		return out
	}
}

// conntrackCleaner returns what deletes stale UDP/SCTP conntrack entries
// after each applied sync, as kube-proxy does. A failed cleanup is logged and
// retried with the next sync; it never fails the sync.
func conntrackCleaner(o *options, syncPeriod time.Duration, log *slog.Logger, metrics *serve.Metrics) (func(*model.State), error) {
	if o.skipConntrackCleanup {
		log.Warn("conntrack cleanup is off (--testing-skip-conntrack-cleanup): UDP clients may stay on deleted endpoints")
		return func(*model.State) {}, nil
	}
	conn, err := conntrack.Dial("")
	if err != nil {
		return nil, err
	}
	c := &conntrack.Cleaner{Table: conn, Log: log, Metrics: conntrack.NewMetrics(metrics.Registry), FullEvery: syncPeriod}
	return func(st *model.State) {
		res, err := c.Clean(st)
		if err != nil {
			log.Error("conntrack cleanup failed; retrying with the next sync", "err", err)
			return
		}
		if res.Scanned {
			log.Log(context.Background(), loglevel.V4, "conntrack cleanup", "read", res.Flows, "deleted", res.Deleted, "took", res.Took)
		}
	}, nil
}

// apiClient connects as kube-proxy does: --kubeconfig and --master, else
// the in-cluster service account.
func (o *options) apiClient() (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if o.kubeconfig == "" && o.master == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --state, --kubeconfig or --master, and not in a cluster: %w", err)
		}
	} else if rc, err = clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig); err != nil {
		return nil, fmt.Errorf("reading the API server configuration: %w", err)
	}
	rc.QPS, rc.Burst, rc.ContentType = o.apiQPS, o.apiBurst, o.apiContentType
	rc.UserAgent = "kube-nftproxy"
	// Its connections can be closed and its requests held back while the
	// API server is away (apisource.APISource's watchdog).
	client, err := apisource.NewAPIClient(rc)
	if err != nil {
		return nil, err
	}
	return client, nil
}

func runCleanup(ctx context.Context, o *options, out io.Writer, log *slog.Logger) error {
	lock, err := instance.Acquire()
	if errors.Is(err, instance.ErrRunning) {
		return fmt.Errorf("%w: stop it before --cleanup, or it writes its tables again", err)
	}
	if err != nil {
		return needPrivileges("taking the instance lock", err)
	}
	if lock.Squatted != "" {
		log.Warn(lock.Squatted)
	}
	defer lock.Release()
	k, err := nftlib.OpenKernel("")
	if err != nil {
		return needPrivileges("opening nftables", err)
	}
	defer k.Close()
	restored := restoreSysctls(k, out, log)
	b, err := nft.NewBackend(k, nft.BackendConfig{Rules: nft.DefaultConfig(), Log: log})
	if err != nil {
		return err
	}
	removed, err := b.Cleanup(ctx)
	if err != nil {
		return needPrivileges("removing the kube-nftproxy tables", err)
	}
	// Both modes' objects: IPVS mode's where the kernel has them.
	removedIPVS, err := cleanupIPVS(ctx, o, k, log)
	if err != nil {
		return needPrivileges("removing IPVS mode's objects", err)
	}
	if removed {
		fmt.Fprintln(out, "removed the kube-nftproxy tables")
	}
	if removedIPVS {
		fmt.Fprintln(out, "removed IPVS mode's virtual servers, "+ipvsnl.DummyName+" and helper tables")
	}
	// Upstream kube-proxy's rules stay: on a node rolled back to kube-proxy
	// (docs/migration.md) they are a running kube-proxy's. Ours removes
	// them after its first sync, and `kube-proxy --cleanup` otherwise.
	if !removed && !removedIPVS && !restored {
		fmt.Fprintln(out, "nothing to clean up")
	}
	return nil
}
