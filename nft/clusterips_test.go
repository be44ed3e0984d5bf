package nft

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// cipPort is a service port of the ClusterIP tests: Service svc (in
// namespace ns), port name port, its ClusterIPs and one endpoint.
type cipPort struct {
	svc, port string
	ips       []string
}

// cipState is State generation gen of lin with the given ports; changed
// names the ports changed since the one before ("svc:port").
func cipState(lin *model.Lineage, gen uint64, changed []string, cidrs []string, ports ...cipPort) *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: "node-1"}
	for i, p := range ports {
		n := proxierName("ns", p.svc, p.port)
		sp := &model.ServicePort{Name: n, Protocol: model.TCP, Port: uint16(80 + i)}
		for _, ip := range p.ips {
			sp.ClusterIPs = append(sp.ClusterIPs, mustAddr(ip))
		}
		st.Services = st.Services.With(n, sp)
		st.Endpoints = st.Endpoints.With(n, []model.Endpoint{{Addr: mustAddr("10.244.0.10"), Port: 8080, NodeName: "node-1", Ready: true, Serving: true}})
	}
	for _, c := range cidrs {
		st.ServiceCIDRs = append(st.ServiceCIDRs, netip.MustParsePrefix(c))
	}
	st.Changes = model.StateChanges{Lineage: lin, Gen: gen}
	for _, c := range changed {
		svc, port, _ := strings.Cut(c, ":")
		st.Changes.Ports = append(st.Changes.Ports, proxierName("ns", svc, port))
	}
	return st
}

// A ClusterIP's set element follows the service ports that hold it: a sync
// adds or deletes it only when the first port comes or the last goes (or
// its comment, the first holder's Service, changes), whatever table the
// ports move to; a change of the ServiceCIDRs rewrites the check chain
// alone. After each sync the kernel holds the elements and the chain a full
// sync would write, and the backend's index is the State's.
func TestClusterIPElementsFollowPorts(t *testing.T) {
	lin := &model.Lineage{}
	a1 := cipPort{"a", "p1", []string{"10.96.0.1", "fd00::1"}}
	a2 := cipPort{"a", "p2", []string{"10.96.0.1", "fd00::1"}}
	a3 := cipPort{"a", "p3", []string{"10.96.0.1", "fd00::1"}}
	b := cipPort{"b", "p", []string{"10.96.0.2"}}
	bMoved := cipPort{"b", "p", []string{"10.96.0.9"}}
	aa := cipPort{"aa", "q", []string{"10.96.0.9"}}
	steps := []struct {
		what string
		st   *model.State
		want []string // the transaction's lines naming the set or chain
	}{
		{"first: a full sync", cipState(lin, 1, nil, nil, a1, a2, b), nil},
		{"one of a's ports goes", cipState(lin, 2, []string{"a:p2"}, nil, a1, b), []string{}},
		{"a gets another port", cipState(lin, 3, []string{"a:p3"}, nil, a1, a3, b), []string{}},
		{"a's last ports go", cipState(lin, 4, []string{"a:p1", "a:p3"}, nil, b), []string{
			"delete element ip kube-nftproxy cluster-ips { 10.96.0.1 }",
			"delete element ip6 kube-nftproxy cluster-ips { fd00::1 }",
		}},
		{"b changes its ClusterIP", cipState(lin, 5, []string{"b:p"}, nil, bMoved), []string{
			"delete element ip kube-nftproxy cluster-ips { 10.96.0.2 }",
			"add element ip kube-nftproxy cluster-ips { 10.96.0.9 comment \"ns/b\" }",
		}},
		{"aa shares b's address and comes first", cipState(lin, 6, []string{"aa:q"}, nil, bMoved, aa), []string{
			"delete element ip kube-nftproxy cluster-ips { 10.96.0.9 }",
			"add element ip kube-nftproxy cluster-ips { 10.96.0.9 comment \"ns/aa\" }",
		}},
		{"b goes, aa still holds the address", cipState(lin, 7, []string{"b:p"}, nil, aa), []string{}},
		{"idle: the delta folds", cipState(lin, 7, nil, nil, aa), []string{}},
		{"ServiceCIDRs appear", cipState(lin, 8, nil, []string{"10.96.0.0/16", "fd00::/112"}, aa), []string{
			"flush chain ip kube-nftproxy cluster-ips-check",
			"add rule ip kube-nftproxy cluster-ips-check ip daddr @cluster-ips reject comment \"reject traffic to ports of ClusterIPs no Service port defines\"",
			"add rule ip kube-nftproxy cluster-ips-check ip daddr 10.96.0.0/16 drop comment \"drop traffic to addresses of ServiceCIDR 10.96.0.0/16 no Service holds\"",
			"flush chain ip6 kube-nftproxy cluster-ips-check",
			"add rule ip6 kube-nftproxy cluster-ips-check ip6 daddr @cluster-ips reject comment \"reject traffic to ports of ClusterIPs no Service port defines\"",
			"add rule ip6 kube-nftproxy cluster-ips-check ip6 daddr fd00::/112 drop comment \"drop traffic to addresses of ServiceCIDR fd00::/112 no Service holds\"",
		}},
	}
	be, k, _ := fakeBackend(t, BackendConfig{})
	for _, s := range steps {
		commits := k.Commits()
		if _, err := be.Sync(context.Background(), s.st); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if s.want != nil {
			tx := ""
			if k.Commits() > commits {
				tx = k.Journal()[len(k.Journal())-1]
			}
			if got := clusterIPLines(tx); !slices.Equal(got, s.want) {
				t.Errorf("%s: the transaction's ClusterIP lines are\n%s\nwant\n%s\n(whole transaction:\n%s)",
					s.what, strings.Join(got, "\n"), strings.Join(s.want, "\n"), tx)
			}
		}
		full := Build(s.st, be.cfg).String()
		if got, want := clusterIPBlocks(k.String()), clusterIPBlocks(full); got != want {
			t.Errorf("%s: the kernel holds\n%s\nwant what a full sync writes\n%s", s.what, got, want)
		}
		if want := newClusterIPIndex(s.st); !equalIndex(be.clusterIPs, want) {
			t.Errorf("%s: the backend's index is %v, want %v", s.what, be.clusterIPs, want)
		}
	}
}

// clusterIPLines are a transaction's lines that name the set or chain.
func clusterIPLines(tx string) []string {
	out := []string{}
	for _, l := range strings.Split(tx, "\n") {
		if strings.Contains(l, "cluster-ips") && !strings.Contains(l, "jump cluster-ips-check") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

var clusterIPBlockRE = regexp.MustCompile(`(?s)\t(?:set cluster-ips|chain cluster-ips-check) \{.*?\n\t\}\n`)

// clusterIPBlocks are the set and chain of a rendered ruleset, every table.
func clusterIPBlocks(text string) string {
	return strings.Join(clusterIPBlockRE.FindAllString(text, -1), "")
}

func equalIndex(a, b clusterIPIndex) bool {
	if len(a) != len(b) {
		return false
	}
	for ip, h := range a {
		if !slices.Equal(h, b[ip]) {
			return false
		}
	}
	return true
}

// In iptables mode (no ClusterIPChecks) the tables hold neither the set nor
// the chain, and nothing jumps to it.
func TestClusterIPChecksOnlyInNFTablesMode(t *testing.T) {
	cfg := demoConfig()
	cfg.ClusterIPChecks = false
	st := demoState()
	st.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	if text := Build(st, cfg).String(); strings.Contains(text, "cluster-ips") {
		t.Errorf("iptables mode's ruleset names cluster-ips:\n%s", text)
	}
	cfg.ClusterIPChecks = true
	text := Build(st, cfg).String()
	for _, want := range []string{"ct state new jump cluster-ips-check", "ip daddr 10.96.0.0/16 drop"} {
		if !strings.Contains(text, want) {
			t.Errorf("nftables mode's ruleset lacks %q", want)
		}
	}
}

// The tracer gives the verdicts: a ClusterIP's undefined port is rejected
// (a lookup in the named set), an unallocated address of a ServiceCIDR is
// dropped, a defined port is DNATed, and iptables mode leaves both alone.
func TestTraceClusterIPChecks(t *testing.T) {
	st := demoState()
	st.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")}
	node := []netip.Addr{mustAddr("10.99.0.1")}
	pod := mustAddr("10.244.0.20")
	pkt := func(dst string, port uint16, output bool) nftlib.Packet {
		src := pod
		if mustAddr(dst).Is6() {
			src = mustAddr("fd00:10:244::20")
		}
		return nftlib.Packet{Src: src, Dst: mustAddr(dst), Proto: 6, Dport: port, Output: output, Local: node}
	}
	tests := []struct {
		name     string
		pkt      nftlib.Packet
		nft, ipt []string
	}{
		{"a defined port", pkt("10.96.0.10", 80, false), []string{"0.500 dnat 10.244.0.10:8080", "0.500 dnat 10.244.0.11:8080"},
			[]string{"0.500 dnat 10.244.0.10:8080", "0.500 dnat 10.244.0.11:8080"}},
		{"an undefined port, forwarded", pkt("10.96.0.10", 81, false), []string{"1.000 reject"}, []string{"1.000 no dnat"}},
		{"an undefined port, from the node", pkt("10.96.0.10", 81, true), []string{"1.000 reject"}, []string{"1.000 no dnat"}},
		{"an undefined port, IPv6", pkt("fd00:10:96::10", 81, false), []string{"1.000 reject"}, []string{"1.000 no dnat"}},
		{"an unallocated address", pkt("10.96.0.200", 80, false), []string{"1.000 drop"}, []string{"1.000 no dnat"}},
		{"an unallocated address, IPv6", pkt("fd00:10:96::200", 80, false), []string{"1.000 drop"}, []string{"1.000 no dnat"}},
		{"outside the ServiceCIDRs", pkt("10.97.0.1", 80, false), []string{"1.000 no dnat"}, []string{"1.000 no dnat"}},
	}
	cfg := demoConfig()
	nftRS := Build(st, cfg)
	cfg.ClusterIPChecks = false
	iptRS := Build(st, cfg)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkTrace(t, nftRS, tt.pkt, tt.nft)
			checkTrace(t, iptRS, tt.pkt, tt.ipt)
		})
	}
}
