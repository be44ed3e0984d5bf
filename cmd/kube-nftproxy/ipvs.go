package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

const (
	modeNFTables = "nftables"
	modeIPTables = "iptables" // iptables mode's behaviour, programmed as nftables
	modeIPVS     = "ipvs"
)

// ipvsSchedulers are the IPVS schedulers kube-proxy accepts for
// --ipvs-scheduler (the kernel's ip_vs_<name> modules).
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"}

// ipvsOptions are kube-proxy's --ipvs-* flags, with its defaults.
type ipvsOptions struct {
	scheduler     string
	syncPeriod    time.Duration
	minSyncPeriod time.Duration
	excludeCIDRs  []string
	strictARP     bool
	tcpTimeout    time.Duration
	tcpFinTimeout time.Duration
	udpTimeout    time.Duration
	// drainCheck is how often draining real servers' connections are
	// counted (upstream: a minute); hidden, for tests.
	drainCheck time.Duration
}

func (o *ipvsOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.scheduler, "ipvs-scheduler", "", "with --proxy-mode ipvs: the IPVS scheduler of every virtual server: "+strings.Join(ipvsSchedulers, ", ")+" (empty: rr, as kube-proxy)")
	fs.DurationVar(&o.syncPeriod, "ipvs-sync-period", 30*time.Second, "with --proxy-mode ipvs: the most time between two syncs; must be greater than 0")
	fs.DurationVar(&o.minSyncPeriod, "ipvs-min-sync-period", time.Second, "with --proxy-mode ipvs: the least time between two syncs; 0 means every Service or EndpointSlice change syncs at once (a --config file's default is 0, as kube-proxy's)")
	fs.StringSliceVar(&o.excludeCIDRs, "ipvs-exclude-cidrs", nil, "with --proxy-mode ipvs: CIDRs whose IPVS virtual servers are never removed (someone else's)")
	fs.BoolVar(&o.strictARP, "ipvs-strict-arp", false, "with --proxy-mode ipvs: set net.ipv4.conf.all.arp_ignore=1 and arp_announce=2")
	fs.DurationVar(&o.tcpTimeout, "ipvs-tcp-timeout", 0, "with --proxy-mode ipvs: IPVS's timeout for idle TCP connections (0 to leave as-is)")
	fs.DurationVar(&o.tcpFinTimeout, "ipvs-tcpfin-timeout", 0, "with --proxy-mode ipvs: IPVS's timeout for TCP connections after a FIN (0 to leave as-is)")
	fs.DurationVar(&o.udpTimeout, "ipvs-udp-timeout", 0, "with --proxy-mode ipvs: IPVS's timeout for UDP flows (0 to leave as-is)")
	fs.DurationVar(&o.drainCheck, "testing-ipvs-drain-check-period", 0, "with --proxy-mode ipvs: how often draining real servers' connections are counted (0: a minute, as kube-proxy); for tests")
	_ = fs.MarkHidden("testing-ipvs-drain-check-period")
}

// validate checks the settings as kube-proxy does: the sync periods of
// the mode in use, timeouts and excluded CIDRs always, the scheduler in
// ipvs mode.
func (o *ipvsOptions) validate(mode string) error {
	if mode == modeIPVS {
		if o.scheduler != "" && !slices.Contains(ipvsSchedulers, o.scheduler) {
			return fmt.Errorf("--ipvs-scheduler %q: want one of %s", o.scheduler, strings.Join(ipvsSchedulers, ", "))
		}
		if o.syncPeriod <= 0 {
			return fmt.Errorf("--ipvs-sync-period %s: must be greater than 0", o.syncPeriod)
		}
		if o.minSyncPeriod < 0 {
			return fmt.Errorf("--ipvs-min-sync-period %s: must be greater than or equal to 0", o.minSyncPeriod)
		}
		if o.minSyncPeriod > o.syncPeriod {
			return fmt.Errorf("--ipvs-sync-period %s: must be greater than or equal to --ipvs-min-sync-period %s", o.syncPeriod, o.minSyncPeriod)
		}
	}
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{{"ipvs-tcp-timeout", o.tcpTimeout}, {"ipvs-tcpfin-timeout", o.tcpFinTimeout}, {"ipvs-udp-timeout", o.udpTimeout}} {
		if t.d < 0 {
			return fmt.Errorf("--%s %s: must be greater than or equal to 0", t.flag, t.d)
		}
	}
	_, err := o.exclude()
	return err
}

// schedulerName is the scheduler to program: an empty one is rr, as in
// kube-proxy.
func (o *ipvsOptions) schedulerName() string {
	if o.scheduler == "" {
		return "rr"
	}
	return o.scheduler
}

func (o *ipvsOptions) exclude() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range o.excludeCIDRs {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--ipvs-exclude-cidrs %q: must be a valid CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func (o *ipvsOptions) timeouts() ipvsnl.Timeouts {
	return ipvsnl.Timeouts{TCP: o.tcpTimeout, TCPFin: o.tcpFinTimeout, UDP: o.udpTimeout}
}

// periods are the loop's sync periods: the --ipvs-* ones in ipvs mode,
// the --iptables-* ones otherwise, as kube-proxy.
func (o *options) periods() (minSync, sync time.Duration) {
	if o.proxyMode == modeIPVS {
		return o.ipvs.minSyncPeriod, o.ipvs.syncPeriod
	}
	return o.minSyncPeriod, o.syncPeriod
}

// ipvsPlanConfig is the plan's configuration from the options.
func ipvsPlanConfig(o *options, cfg nft.Config) (ipvs.Config, error) {
	return ipvs.Config{Scheduler: o.ipvs.schedulerName(), NodePortAddresses: cfg.NodePortAddresses, NodePortPrimary: cfg.NodePortPrimary}, nil
}

// procIPVS is where a kernel with IPVS shows its table.
var procIPVS = "/proc/net/ip_vs"

// openIPVS checks that the kernel has IPVS and opens it, with a message
// that says what to do when it has not. Nothing is executed (no modprobe).
func openIPVS() (*ipvsnl.Conn, error) {
	if _, err := os.Stat(procIPVS); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("--proxy-mode ipvs: %w: %s is missing; load the ip_vs module (and ip_vs_<scheduler>) on the node, or use --proxy-mode nftables", ipvsnl.ErrNoIPVS, procIPVS)
	}
	c, err := ipvsnl.Dial("")
	if errors.Is(err, ipvsnl.ErrNoIPVS) {
		return nil, fmt.Errorf("--proxy-mode ipvs: %w; load the ip_vs module on the node, or use --proxy-mode nftables", err)
	}
	if err != nil {
		return nil, needPrivileges("--proxy-mode ipvs: opening IPVS", err)
	}
	return c, nil
}

// ipvsNodeAddrs returns the node's local addresses but kube-ipvs0's: those
// NodePort virtual servers listen on (the plan drops loopback). IPv6
// link-local addresses are left out: a virtual server cannot carry a zone.
// They are read again only after the kernel says an address changed.
func ipvsNodeAddrs(c *netns.AddrCache) func() ([]netip.Addr, error) {
	return func() ([]netip.Addr, error) {
		all, err := c.Addrs()
		if err != nil {
			return nil, err
		}
		return slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return a.Is6() && a.IsLinkLocalUnicast() }), nil
	}
}

// newIPVSBackend sets IPVS mode's sysctls (through sys) and timeouts and returns its
// backend over conn, with the helper tables through k and kube-ipvs0;
// hooks connect it to the loop.
func newIPVSBackend(o *options, cfg nft.Config, k *nftlib.Kernel, conn *ipvsnl.Conn, sys *sysctl.Sysctl, log *slog.Logger, hooks *backendHooks) (*ipvs.Backend, error) {
	planCfg, err := ipvsPlanConfig(o, cfg)
	if err != nil {
		return nil, err
	}
	exclude, err := o.ipvs.exclude()
	if err != nil {
		return nil, err
	}
	if err := ipvs.ApplySysctls(sys, o.ipvs.strictARP, log); err != nil {
		return nil, fmt.Errorf("setting IPVS mode's sysctls: %w", err)
	}
	if err := conn.SetTimeouts(o.ipvs.timeouts()); err != nil {
		return nil, fmt.Errorf("setting IPVS timeouts (--ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout): %w", err)
	}
	link, err := ipvsnl.OpenDummy("")
	if err != nil {
		return nil, needPrivileges("creating "+ipvsnl.DummyName, err)
	}
	addrs, err := netns.NewAddrCache(ipvsnl.DummyName)
	if err != nil {
		return nil, err
	}
	return ipvs.NewBackend(conn, ipvs.BackendConfig{
		Plan:      planCfg,
		Sync:      ipvs.SyncConfig{ExcludeCIDRs: exclude, DrainCheck: o.ipvs.drainCheck},
		NodeAddrs: ipvsNodeAddrs(addrs),
		NewHelper: func(node model.Node) (ipvs.Helper, error) {
			return ipvs.NewNftHelper(k, cfg.Settings, node, link), nil
		},
		CleanupHelper: func() (bool, error) { return ipvs.CleanupHelpers(k, "") },
		// Each sync period, IPVS and kube-ipvs0 are read back (IPVS
		// sends no change events); the helper tables are repaired as
		// soon as the change monitor sees another process change them.
		CheckEvery: o.ipvs.syncPeriod,
		// The kernel's monitor follows the helper tables (no nftables
		// mode's Backend uses it here); Kernel.Close closes it.
		Watch: func(onChange func()) (ipvs.ChangeMonitor, error) {
			if err := k.Watch(ipvs.HelperTableRefs(), nftlib.MonitorRcvBuf, onChange); err != nil {
				return nil, fmt.Errorf("following nftables changes: %w", err)
			}
			hooks.others = k.OtherChanges
			return k.Monitor(), nil
		},
		Log: log,
		// Draining real servers are checked at the times it asks for;
		// another process's change to a helper table is repaired now.
		SyncAt:          hooks.SyncAt,
		OnForeignChange: hooks.Changed,
		OnDrift:         hooks.Drift,
	}), nil
}

// renderIPVS prints what ipvs mode programs for st: the helper tables,
// the virtual servers as `ipvsadm -Sn` prints them and kube-ipvs0's
// addresses. The node's addresses are taken from its Node object.
func renderIPVS(w io.Writer, o *options, st *model.State) error {
	cfg, err := o.nftConfig()
	if err != nil {
		return err
	}
	planCfg, err := ipvsPlanConfig(o, cfg)
	if err != nil {
		return err
	}
	plan := ipvs.BuildPlan(st, planCfg, st.Node.IPs)
	var b strings.Builder
	helpers := nftlib.Ruleset{Tables: ipvs.HelperTables(cfg.Settings, st.Node, plan.Elements())}
	if err := helpers.Render(&b); err != nil {
		return err
	}
	b.WriteString("# virtual servers (ipvsadm -Sn)\n")
	if err := ipvs.WriteRules(&b, plan.VirtualServers()); err != nil {
		return err
	}
	b.WriteString("# " + ipvsnl.DummyName + " addresses\n")
	if err := ipvs.WriteAddrs(&b, plan.Addrs()); err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// cleanupIPVS removes IPVS mode's objects: kube-ipvs0, the helper tables
// and, where the kernel has IPVS, the virtual servers (but those in
// --ipvs-exclude-cidrs). A kernel without IPVS is no error.
func cleanupIPVS(ctx context.Context, o *options, k *nftlib.Kernel, log *slog.Logger) (bool, error) {
	exclude, err := o.ipvs.exclude()
	if err != nil {
		return false, err
	}
	var kernel ipvsnl.Kernel
	if _, err := os.Stat(procIPVS); err == nil {
		c, err := ipvsnl.Dial("")
		switch {
		case errors.Is(err, ipvsnl.ErrNoIPVS):
		case err != nil:
			return false, needPrivileges("opening IPVS", err)
		default:
			defer c.Close()
			kernel = c
		}
	}
	if kernel == nil {
		log.Debug("the kernel has no IPVS: no virtual servers to remove")
	}
	b := ipvs.NewBackend(kernel, ipvs.BackendConfig{
		Sync:          ipvs.SyncConfig{ExcludeCIDRs: exclude},
		CleanupHelper: func() (bool, error) { return ipvs.CleanupHelpers(k, "") },
	})
	return b.Cleanup(ctx)
}
