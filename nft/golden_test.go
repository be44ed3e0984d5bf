package nft

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// goldenDir holds one directory per golden case: Kubernetes YAML (what
// `kube-nftproxy render --state DIR` reads), a flags file, and the
// expected ruleset DIR/DIR.nft. See its README.md.
const goldenDir = "testdata/golden"

type goldenCase struct {
	name string // the case's directory under goldenDir
	file string // its ruleset, relative to testdata (as golden.Check takes it)
	st   *model.State
	cfg  Config
}

// goldenCases are representative states, read from goldenDir: every term
// and chain kind appears.
func goldenCases(t testing.TB) []goldenCase {
	t.Helper()
	entries, err := os.ReadDir(goldenDir)
	if err != nil {
		t.Fatalf("golden cases: %v", err)
	}
	var cases []goldenCase
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		tc, err := loadGoldenCase(e.Name())
		if err != nil {
			t.Fatalf("golden case %s: %v", e.Name(), err)
		}
		cases = append(cases, tc)
	}
	if len(cases) == 0 {
		t.Fatalf("no golden cases in %s", goldenDir)
	}
	return cases
}

// loadGoldenCase reads one case: its flags, then its state as the node
// --hostname-override names. Any problem with the YAML fails the case:
// a skipped object would silently shrink what the case covers.
func loadGoldenCase(name string) (goldenCase, error) {
	dir := filepath.Join(goldenDir, name)
	args, err := golden.FlagsFile(filepath.Join(dir, "flags"))
	if err != nil {
		return goldenCase{}, err
	}
	cfg, node, err := goldenConfig(args)
	if err != nil {
		return goldenCase{}, fmt.Errorf("%s/flags: %w", dir, err)
	}
	st, problems := filesource.LoadState(dir, node)
	if len(problems) > 0 {
		return goldenCase{}, fmt.Errorf("%s: %v", dir, problems)
	}
	return goldenCase{name: name, file: filepath.Join("golden", name, name+".nft"), st: st, cfg: cfg}, nil
}

// goldenConfig maps the rule flags of `kube-nftproxy render` to a Config
// and the node name. The mapping itself lives in package main, which tests
// here cannot import; cmd/kube-nftproxy's TestRenderGoldenCases renders
// every case with the real flags and checks it gets the same ruleset, so
// this copy cannot drift. Unknown flags are an error.
func goldenConfig(args []string) (Config, string, error) {
	var (
		node, clusterCIDR, detect, bridge, prefix, mode string
		nodePortAddrs                                   []string
		masqBit                                         int
		localhost                                       bool
		cfg                                             = DefaultConfig()
	)
	fs := pflag.NewFlagSet("golden", pflag.ContinueOnError)
	fs.StringVar(&node, "hostname-override", "", "")
	fs.StringVar(&clusterCIDR, "cluster-cidr", "", "")
	fs.BoolVar(&cfg.MasqueradeAll, "masquerade-all", false, "")
	fs.IntVar(&masqBit, "iptables-masquerade-bit", int(cfg.MasqueradeBit), "")
	fs.StringVar(&detect, "detect-local-mode", proxier.DetectClusterCIDR, "")
	fs.StringVar(&bridge, "pod-bridge-interface", "", "")
	fs.StringVar(&prefix, "pod-interface-name-prefix", "", "")
	fs.StringSliceVar(&nodePortAddrs, "nodeport-addresses", nil, "")
	fs.BoolVar(&cfg.ConntrackTCPBeLiberal, "conntrack-tcp-be-liberal", false, "")
	fs.StringVar(&mode, "proxy-mode", "", "") // as the proxy: empty is iptables
	fs.BoolVar(&localhost, "iptables-localhost-nodeports", true, "")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if mode == "" {
		mode = "iptables" // as the proxy and render: kube-proxy's default
	}
	// iptables mode serves NodePorts on localhost unless told not to.
	cfg.LocalhostNodePorts = mode == "iptables" && localhost
	cfg.ClusterIPChecks = mode == "nftables"
	cfg.MasqueradeBit = uint(masqBit)
	cfg.DetectLocal = proxier.LocalDetector{Mode: detect, BridgeInterface: bridge, InterfacePrefix: prefix}
	if len(nodePortAddrs) == 0 && mode == "nftables" {
		nodePortAddrs = []string{"primary"} // nftables mode's default, as kube-proxy's
	}
	for _, a := range nodePortAddrs {
		switch a {
		case "primary":
			cfg.NodePortPrimary = true
			continue
		case "all":
			cfg.NodePortAddresses = append(cfg.NodePortAddresses, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
			continue
		}
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return cfg, "", fmt.Errorf("--nodeport-addresses: %w", err)
		}
		cfg.NodePortAddresses = append(cfg.NodePortAddresses, p.Masked())
	}
	for _, s := range strings.FieldsFunc(clusterCIDR, func(r rune) bool { return r == ',' }) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return cfg, "", fmt.Errorf("--cluster-cidr: %w", err)
		}
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, p.Masked())
	}
	return cfg, node, cfg.Validate()
}

// Golden nft text for representative states: a change to what we program
// shows up in review as a diff of these files (go test ./nft -update).
func TestGolden(t *testing.T) {
	for _, tt := range goldenCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			golden.Check(t, tt.file, "render", Build(tt.st, tt.cfg).String())
		})
	}
}

// The Go-built states other tests use (the trace tests' demoState and
// featureState) are the golden demo and features cases: the same rulesets.
func TestGoldenGoStates(t *testing.T) {
	for _, tt := range []struct {
		name string
		st   *model.State
	}{{"demo", demoState()}, {"features", featureState()}} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(goldenDir, tt.name, tt.name+".nft"))
			if err != nil {
				t.Fatal(err)
			}
			if got := Build(tt.st, demoConfig()).String(); got != string(want) {
				t.Errorf("%s differs from the golden %s case:\n%s", tt.name+"State()", tt.name, got)
			}
		})
	}
}
