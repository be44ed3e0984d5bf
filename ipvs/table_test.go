package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// helperState is demoState plus what it lacks for the helper sets: a
// Cluster-policy UDP NodePort with an external and an LB IP, and a
// Local-policy SCTP and UDP NodePort.
func helperState() *model.State {
	st := demoState()
	add := func(svc *model.ServicePort, eps ...model.Endpoint) {
		st.Services = st.Services.With(svc.Name, svc)
		st.Endpoints = st.Endpoints.With(svc.Name, eps)
	}
	add(&model.ServicePort{Name: spn("games", "udp", "play"), Protocol: model.UDP, Port: 7777, NodePort: 30777,
		ClusterIPs:      []netip.Addr{ip("10.96.7.7")},
		ExternalIPs:     []netip.Addr{ip("192.0.2.77")},
		LoadBalancerIPs: []netip.Addr{ip("198.51.100.77")}},
		ready("10.244.0.77", 7777, node))
	add(&model.ServicePort{Name: spn("telco", "sig-local", ""), Protocol: model.SCTP, Port: 3869, NodePort: 31869,
		ClusterIPs: []netip.Addr{ip("10.96.5.6")}, ExternalPolicyLocal: true},
		ready("10.244.0.8", 3869, node))
	add(&model.ServicePort{Name: spn("games", "udp-local", "play"), Protocol: model.UDP, Port: 7778, NodePort: 30778,
		ClusterIPs: []netip.Addr{ip("10.96.7.8")}, ExternalPolicyLocal: true},
		ready("10.244.0.78", 7778, node))
	return st
}

// planElements are a plan's helper set elements, each once.
func planElements(p *Plan) []Element {
	seen := map[Element]bool{}
	var out []Element
	for _, fr := range p.Services {
		for _, e := range fr.Elements() {
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, compareElements)
	return out
}

func helperConfig() proxier.Settings {
	cfg := proxier.DefaultSettings()
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	return cfg
}

type helperCase struct {
	file string
	cfg  proxier.Settings
}

func helperCases() []helperCase {
	masqAll := proxier.DefaultSettings()
	masqAll.MasqueradeAll = true
	masqAll.MasqueradeBit = 10
	iface := proxier.DefaultSettings()
	iface.DetectLocal = proxier.LocalDetector{Mode: proxier.DetectInterfaceNamePrefix, InterfacePrefix: "veth"}
	return []helperCase{
		{"helper-cluster-cidr.nft", helperConfig()},
		{"helper-masquerade-all.nft", masqAll},
		{"helper-interface-prefix.nft", iface},
		{"helper-no-detect-local.nft", proxier.DefaultSettings()},
	}
}

func renderHelper(cfg proxier.Settings, elems []Element) string {
	var b strings.Builder
	rs := nftlib.Ruleset{Tables: HelperTables(cfg, helperState().Node, elems)}
	b.WriteString(rs.String())
	return b.String()
}

// The golden state puts at least one element in every helper set, in
// both families where the set can hold addresses of both.
func TestHelperStateCoversEverySet(t *testing.T) {
	elems := planElements(BuildPlan(helperState(), Config{}, nodeAddrs))
	has := map[string]bool{}
	v6 := false
	for _, e := range elems {
		has[e.Set] = true
		v6 = v6 || e.V6
	}
	for _, s := range Sets {
		if !has[s.Name] {
			t.Errorf("no element in %s", s.Name)
		}
	}
	if !v6 {
		t.Errorf("no IPv6 element")
	}
}

// Golden nft text of the helper tables (go test ./ipvs -update rewrites it).
func TestHelperGolden(t *testing.T) {
	elems := planElements(BuildPlan(helperState(), Config{}, nodeAddrs))
	for _, tc := range helperCases() {
		t.Run(tc.file, func(t *testing.T) {
			golden.Check(t, tc.file, "render", renderHelper(tc.cfg, elems))
		})
	}
}

// What the rules must say, whatever the layout: a change that loses one
// of these fails here and not only in the golden diff.
func TestHelperRules(t *testing.T) {
	tbl := BuildHelperTable(nftlib.IPv4, helperConfig(), model.Node{})
	text := (&nftlib.Ruleset{Tables: []*nftlib.Table{tbl}}).String()
	for _, want := range []string{
		"type nat hook prerouting priority dstnat; policy accept;",
		"type nat hook output priority -100; policy accept;",
		"type nat hook postrouting priority srcnat; policy accept;",
		"type filter hook input priority filter; policy accept;",
		"type filter hook output priority -110; policy accept;",
		"ip daddr . meta l4proto . th dport @KUBE-CLUSTER-IP ip saddr != 10.244.0.0/16 jump KUBE-MARK-MASQ",
		"ip daddr . meta l4proto . th dport . ip saddr @KUBE-LOOP-BACK masquerade",
		"ct state new ip daddr @KUBE-IPVS-IPS reject",
		"tcp dport @KUBE-NODE-PORT-LOCAL-TCP return",
		"ip daddr . sctp dport @KUBE-NODE-PORT-SCTP-HASH goto KUBE-MARK-MASQ",
		"ip daddr . meta l4proto . th dport . ip saddr @KUBE-LOAD-BALANCER-SOURCE-CIDR return",
		"type ipv4_addr . inet_proto . inet_service . ipv4_addr\n\t\tflags interval",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("helper table lacks %q", want)
		}
	}
	for _, never := range []string{"ct state invalid", "dnat", "KUBE-EXTERNAL-SERVICES"} {
		if strings.Contains(text, never) {
			t.Errorf("helper table has %q, which IPVS mode does not", never)
		}
	}
	for _, s := range tbl.Maps {
		if s.Comment == "" {
			t.Errorf("set %s has no comment", s.Name)
		}
	}
}

// Every element survives the trip to the table's form and back.
func TestSetElementRoundTrip(t *testing.T) {
	for _, e := range planElements(BuildPlan(helperState(), Config{}, nodeAddrs)) {
		if got := fromSetElement(e.Set, e.V6, setElement(e)); got != e {
			t.Errorf("%s %s: round trip gave %+v, want %+v", e.Set, e, got, e)
		}
	}
}

func TestHelperElementChanges(t *testing.T) {
	h := NewNftHelper(nil, helperConfig(), model.Node{}, nil)
	c := HelperChange{
		AddElems: []Element{
			{Set: SetClusterIP, Addr: ip("10.96.0.1"), Protocol: model.TCP, Port: 443},
			{Set: SetNodePortUDP, Port: 30053},
			{Set: SetClusterIP, Addr: ip("10.96.0.10"), Protocol: model.UDP, Port: 53},
			{Set: SetClusterIP, V6: true, Addr: ip("fd00::1"), Protocol: model.TCP, Port: 80},
		},
		DelElems: []Element{{Set: SetLBSourceCIDR, Addr: ip("198.51.100.1"), Protocol: model.TCP, Port: 80, Net: netip.MustParsePrefix("10.0.0.0/8")}},
	}
	got := elementChangesText(h.elementChanges(c))
	want := `add element ip kube-nftproxy-ipvs KUBE-CLUSTER-IP { 10.96.0.1 . tcp . 443 }
add element ip kube-nftproxy-ipvs KUBE-CLUSTER-IP { 10.96.0.10 . udp . 53 }
add element ip kube-nftproxy-ipvs KUBE-NODE-PORT-UDP { 30053 }
add element ip6 kube-nftproxy-ipvs KUBE-CLUSTER-IP { fd00::1 . tcp . 80 }
delete element ip kube-nftproxy-ipvs KUBE-LOAD-BALANCER-SOURCE-CIDR { 198.51.100.1 . tcp . 80 . 10.0.0.0/8 }
`
	if got != want {
		t.Errorf("element transaction:\n%s\nwant:\n%s", got, want)
	}
}

// elementChangesText is element changes as nft commands, each element's
// fields that are set joined as the set's concatenated key.
func elementChangesText(changes []elementChange) string {
	var b strings.Builder
	for _, c := range changes {
		verb := "add"
		if c.delete {
			verb = "delete"
		}
		for _, el := range c.elements {
			e := el.Key
			var key []string
			if e.Addr.IsValid() {
				key = append(key, e.Addr.String())
			}
			if e.Proto != 0 {
				key = append(key, nftlib.ProtoName(e.Proto))
			}
			if e.Port != 0 {
				key = append(key, strconv.Itoa(int(e.Port)))
			}
			if e.Net.IsValid() {
				key = append(key, e.Net.String())
			}
			fmt.Fprintf(&b, "%s element %s %s %s { %s }\n", verb, c.table.Family, c.table.Name, c.set, strings.Join(key, " . "))
		}
	}
	return b.String()
}

// nft itself accepts what we render.
func TestHelperRenderNftCheck(t *testing.T) {
	ns := testns.New(t, "knp-ipvs-")
	elems := planElements(BuildPlan(helperState(), Config{}, nodeAddrs))
	for _, tc := range helperCases() {
		path := filepath.Join(t.TempDir(), tc.file)
		if err := os.WriteFile(path, []byte(renderHelper(tc.cfg, elems)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", path).CombinedOutput(); err != nil {
			t.Errorf("%s: nft -c -f: %v: %s", tc.file, err, out)
		}
	}
}
