package ipvs

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

const node = "node-a"

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func spn(ns, name, port string) model.ServicePortName {
	return model.ServicePortName{Namespace: ns, Name: name, Port: port}
}

func ready(a string, port uint16, node string) model.Endpoint {
	return model.Endpoint{Addr: ip(a), Port: port, NodeName: node, Ready: true, Serving: true}
}

func terminating(a string, port uint16, node string) model.Endpoint {
	return model.Endpoint{Addr: ip(a), Port: port, NodeName: node, Serving: true, Terminating: true}
}

var nodeAddrs = []netip.Addr{ip("10.99.0.1"), ip("127.0.0.1"), ip("::1"), ip("fd00:99::1"), ip("172.17.0.1")}

// demoState has a ClusterIP-only TCP service, a UDP one with a local
// endpoint, a dual-stack NodePort+external+LB service with eTP Local,
// source ranges, a health check port and a terminating endpoint, an SCTP
// NodePort and an external IP that is a node address.
func demoState() *model.State {
	st := model.NewState()
	st.Node = model.Node{Name: node, IPs: []netip.Addr{ip("10.99.0.1"), ip("fd00:99::1")}}
	add := func(svc *model.ServicePort, eps ...model.Endpoint) {
		st.Services = st.Services.With(svc.Name, svc)
		st.Endpoints = st.Endpoints.With(svc.Name, eps)
	}
	add(&model.ServicePort{Name: spn("default", "kubernetes", "https"), Protocol: model.TCP, Port: 443,
		ClusterIPs: []netip.Addr{ip("10.96.0.1")}},
		ready("10.99.0.1", 6443, ""))
	add(&model.ServicePort{Name: spn("kube-system", "kube-dns", "dns"), Protocol: model.UDP, Port: 53,
		ClusterIPs: []netip.Addr{ip("10.96.0.10")}},
		ready("10.244.0.5", 53, node), ready("10.244.1.5", 53, "node-b"))
	add(&model.ServicePort{Name: spn("kube-system", "kube-dns", "dns-tcp"), Protocol: model.TCP, Port: 53,
		ClusterIPs: []netip.Addr{ip("10.96.0.10")}},
		ready("10.244.0.5", 53, node), ready("10.244.1.5", 53, "node-b"))
	add(&model.ServicePort{Name: spn("shop", "web", "http"), Protocol: model.TCP, Port: 80, NodePort: 30080,
		ClusterIPs:               []netip.Addr{ip("10.96.0.20"), ip("fd00:10:96::20")},
		ExternalIPs:              []netip.Addr{ip("192.0.2.10"), ip("10.99.0.1")},
		LoadBalancerIPs:          []netip.Addr{ip("198.51.100.10"), ip("2001:db8::10")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.99.0.0/16"), netip.MustParsePrefix("2001:db8:1::/48")},
		ExternalPolicyLocal:      true, HealthCheckNodePort: 32000},
		ready("10.244.0.10", 8080, node), ready("10.244.1.10", 8080, "node-b"), terminating("10.244.1.11", 8080, "node-b"),
		ready("fd00:10:244::10", 8080, "node-b"))
	add(&model.ServicePort{Name: spn("telco", "sig", ""), Protocol: model.SCTP, Port: 3868, NodePort: 31868,
		ClusterIPs: []netip.Addr{ip("10.96.5.5")}},
		terminating("10.244.0.7", 3868, node))
	add(&model.ServicePort{Name: spn("default", "headless-like", ""), Protocol: model.TCP, Port: 1,
		ExternalIPs: []netip.Addr{ip("192.0.2.99")}}) // no ClusterIP: not programmed
	return st
}

func affinityState() *model.State {
	st := demoState()
	for name, svc := range st.Services.All() {
		c := *svc
		c.AffinityTimeout = 10800 * time.Second
		st.Services = st.Services.With(name, &c)
	}
	return st
}

// Golden text of representative plans: a change to what we program shows
// up in review as a diff of these files (go test ./ipvs -update).
func TestGolden(t *testing.T) {
	npCfg := Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}}
	for _, tt := range []struct {
		file string
		st   *model.State
		cfg  Config
	}{
		{"demo.txt", demoState(), Config{}},
		{"affinity-mh.txt", affinityState(), Config{Scheduler: "mh"}},
		{"nodeport-addresses.txt", demoState(), npCfg},
	} {
		t.Run(tt.file, func(t *testing.T) {
			golden.Check(t, tt.file, "plan", BuildPlan(tt.st, tt.cfg, nodeAddrs).String())
		})
	}
}

// rules renders the named virtual servers of a one-service plan.
func rules(p *Plan) string {
	var b strings.Builder
	_ = WriteRules(&b, p.VirtualServers())
	return b.String()
}

func TestPlanRealServers(t *testing.T) {
	n := spn("ns", "svc", "p")
	base := model.ServicePort{Name: n, Protocol: model.TCP, Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.1")}}
	withNodePort := base
	withNodePort.NodePort = 30000
	for _, tt := range []struct {
		name string
		svc  model.ServicePort
		eps  []model.Endpoint
		want string
	}{
		{"cluster policy: every ready endpoint", base,
			[]model.Endpoint{ready("10.244.1.1", 8080, "b"), ready("10.244.0.1", 8080, node)},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.0.1:8080 -m -w 1\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n"},
		{"terminating beside ready: left out (a real server drains)", base,
			[]model.Endpoint{ready("10.244.1.1", 8080, "b"), terminating("10.244.1.2", 8080, "b"),
				{Addr: ip("10.244.1.3"), Port: 8080, Terminating: true}}, // not serving: left out
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n"},
		{"only terminating: they serve, weight 1", base,
			[]model.Endpoint{terminating("10.244.1.2", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 1\n"},
		{"not ready nor serving: no real server", base,
			[]model.Endpoint{{Addr: ip("10.244.1.2"), Port: 8080}},
			"-A -t 10.96.0.1:80 -s rr\n"},
		{"iTP Local: local endpoints only", func() model.ServicePort { s := base; s.InternalPolicyLocal = true; return s }(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b"), ready("10.244.0.1", 8080, node)},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.0.1:8080 -m -w 1\n"},
		{"iTP Local without local endpoint, not external: none", func() model.ServicePort { s := base; s.InternalPolicyLocal = true; return s }(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n"},
		{"eTP Local: NodePort local only, ClusterIP all", func() model.ServicePort { s := withNodePort; s.ExternalPolicyLocal = true; return s }(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b"), ready("10.244.0.1", 8080, node), terminating("10.244.0.2", 8080, node), terminating("10.244.1.2", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.0.1:8080 -m -w 1\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n" +
				"-A -t 10.99.0.1:30000 -s rr\n-a -t 10.99.0.1:30000 -r 10.244.0.1:8080 -m -w 1\n"},
		{"eTP and iTP Local without local endpoint, externally accessible: cluster fallback for both", func() model.ServicePort {
			s := withNodePort
			s.ExternalPolicyLocal, s.InternalPolicyLocal = true, true
			return s
		}(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n" +
				"-A -t 10.99.0.1:30000 -s rr\n-a -t 10.99.0.1:30000 -r 10.244.1.1:8080 -m -w 1\n"},
		{"iTP Local without local endpoint, NodePort with eTP Cluster: cluster fallback", func() model.ServicePort { s := withNodePort; s.InternalPolicyLocal = true; return s }(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n" +
				"-A -t 10.99.0.1:30000 -s rr\n-a -t 10.99.0.1:30000 -r 10.244.1.1:8080 -m -w 1\n"},
		{"eTP Local without local endpoint: cluster fallback (#97081)", func() model.ServicePort { s := withNodePort; s.ExternalPolicyLocal = true; return s }(),
			[]model.Endpoint{ready("10.244.1.1", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n" +
				"-A -t 10.99.0.1:30000 -s rr\n-a -t 10.99.0.1:30000 -r 10.244.1.1:8080 -m -w 1\n"},
		{"other family's endpoints ignored", base,
			[]model.Endpoint{ready("fd00::1", 8080, "b")},
			"-A -t 10.96.0.1:80 -s rr\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := model.NewState()
			st.Node.Name = node
			svc := tt.svc
			st.Services, st.Endpoints = st.Services.With(n, &svc), st.Endpoints.With(n, tt.eps)
			if got := rules(BuildPlan(st, Config{}, []netip.Addr{ip("10.99.0.1")})); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestPlanServices(t *testing.T) {
	n := spn("ns", "svc", "")
	for _, tt := range []struct {
		name string
		cfg  Config
		svc  model.ServicePort
		want string
	}{
		{"affinity: persistent with the timeout", Config{},
			model.ServicePort{Protocol: model.UDP, Port: 53, ClusterIPs: []netip.Addr{ip("10.96.0.10")}, AffinityTimeout: 90 * time.Second},
			"-A -u 10.96.0.10:53 -s rr -p 90\n"},
		{"mh adds its port flag", Config{Scheduler: "mh"},
			model.ServicePort{Protocol: model.TCP, Port: 80, ClusterIPs: []netip.Addr{ip("fd00::10")}},
			"-A -t [fd00::10]:80 -s mh -b mh-port\n"},
		{"NodePorts on every node address but loopback", Config{Scheduler: "wrr"},
			model.ServicePort{Protocol: model.SCTP, Port: 80, NodePort: 30001, ClusterIPs: []netip.Addr{ip("10.96.0.1")}},
			"-A --sctp-service 10.96.0.1:80 -s wrr\n-A --sctp-service 10.99.0.1:30001 -s wrr\n-A --sctp-service 172.17.0.1:30001 -s wrr\n"},
		{"--nodeport-addresses of the family", Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("fd00::/8")}},
			model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30001, ClusterIPs: []netip.Addr{ip("10.96.0.1"), ip("fd00::1")}},
			"-A -t 10.96.0.1:80 -s rr\n-A -t 172.17.0.1:30001 -s rr\n-A -t [fd00::1]:80 -s rr\n-A -t [fd00:99::1]:30001 -s rr\n"},
		{"no prefix of a family: all of its addresses", Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}},
			model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30001, ClusterIPs: []netip.Addr{ip("fd00::1")}},
			"-A -t [fd00::1]:80 -s rr\n-A -t [fd00:99::1]:30001 -s rr\n"},
		{"--nodeport-addresses primary: the Node object's first address of each family", Config{NodePortPrimary: true},
			model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30001, ClusterIPs: []netip.Addr{ip("10.96.0.1"), ip("fd00::1")}},
			"-A -t 10.96.0.1:80 -s rr\n-A -t 172.17.0.1:30001 -s rr\n-A -t [fd00::1]:80 -s rr\n-A -t [fd00:99::1]:30001 -s rr\n"},
		{"--nodeport-addresses primary, a primary address that is not local: none of that family", Config{NodePortPrimary: true},
			model.ServicePort{Protocol: model.TCP, Port: 80, NodePort: 30001, ClusterIPs: []netip.Addr{ip("10.96.0.1")}},
			"-A -t 10.96.0.1:80 -s rr\n"},
		{"no ClusterIP: nothing", Config{},
			model.ServicePort{Protocol: model.TCP, Port: 80, ExternalIPs: []netip.Addr{ip("192.0.2.1")}},
			""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := model.NewState()
			// The Node object's addresses, primary first (loopback and
			// ExternalIPs after); fd00:99::1 is local, 192.0.2.1 is not.
			st.Node.IPs = []netip.Addr{ip("172.17.0.1"), ip("fd00:99::1"), ip("10.99.0.1")}
			if strings.Contains(tt.name, "not local") {
				st.Node.IPs = []netip.Addr{ip("192.0.2.1"), ip("fd00:99::1")}
			}
			svc := tt.svc
			svc.Name = n
			st.Services = st.Services.With(n, &svc)
			if got := rules(BuildPlan(st, tt.cfg, nodeAddrs)); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestPlanAddrsAndElements(t *testing.T) {
	p := BuildPlan(demoState(), Config{}, nodeAddrs)
	// ClusterIPs and the external and LB IPs that are not node addresses.
	wantAddrs := []string{"10.96.0.1", "10.96.0.10", "10.96.0.20", "10.96.5.5", "192.0.2.10", "198.51.100.10", "2001:db8::10", "fd00:10:96::20"}
	var got []string
	for _, a := range p.Addrs() {
		got = append(got, a.String())
	}
	if !slices.Equal(got, wantAddrs) {
		t.Errorf("kube-ipvs0 addresses %v, want %v", got, wantAddrs)
	}
	has := func(e Element) bool { return slices.Contains(p.Elements(), e) }
	for _, tt := range []struct {
		e    Element
		want bool
	}{
		{Element{Set: SetClusterIP, Addr: ip("10.96.0.10"), Protocol: model.UDP, Port: 53}, true},
		{Element{Set: SetExternalIPLocal, Addr: ip("192.0.2.10"), Protocol: model.TCP, Port: 80}, true},
		{Element{Set: SetExternalIP, Addr: ip("192.0.2.10"), Protocol: model.TCP, Port: 80}, false},
		{Element{Set: SetLoadBalancerLocal, Addr: ip("198.51.100.10"), Protocol: model.TCP, Port: 80}, true},
		{Element{Set: SetLBSourceCIDR, Addr: ip("198.51.100.10"), Protocol: model.TCP, Port: 80, Net: netip.MustParsePrefix("203.0.113.0/24")}, true},
		{Element{Set: SetLBSourceCIDR, Addr: ip("198.51.100.10"), Protocol: model.TCP, Port: 80, Net: netip.MustParsePrefix("2001:db8:1::/48")}, false},
		{Element{Set: SetLBSourceIP, Addr: ip("198.51.100.10"), Protocol: model.TCP, Port: 80, Addr2: ip("198.51.100.10")}, true},
		{Element{Set: SetLBSourceIP, Addr: ip("2001:db8::10"), Protocol: model.TCP, Port: 80, Addr2: ip("2001:db8::10"), V6: true}, false}, // no v6 range holds the node
		{Element{Set: SetNodePortTCP, Port: 30080}, true},
		{Element{Set: SetNodePortLocalTCP, Port: 30080}, true},
		{Element{Set: SetNodePortSCTP, Addr: ip("10.99.0.1"), Port: 31868}, true},
		{Element{Set: SetNodePortSCTP, Addr: ip("127.0.0.1"), Port: 31868}, false},
		{Element{Set: SetHealthCheckNodePort, Port: 32000}, true},
		{Element{Set: SetNodePortTCP, Port: 30080, V6: true}, true},
		{Element{Set: SetNodePortSCTP, Port: 31868, V6: true}, false}, // IPv4-only service
		{Element{Set: SetLoopBack, Addr: ip("10.244.0.5"), Protocol: model.UDP, Port: 53, Addr2: ip("10.244.0.5")}, true},
		{Element{Set: SetLoopBack, Addr: ip("10.244.1.5"), Protocol: model.UDP, Port: 53, Addr2: ip("10.244.1.5")}, false}, // not local
		{Element{Set: SetIPVSIPs, Addr: ip("10.99.0.1")}, false},
		{Element{Set: SetIPVSIPs, Addr: ip("2001:db8::10"), V6: true}, true},
	} {
		if has(tt.e) != tt.want {
			t.Errorf("%s %s: present %v, want %v", tt.e.Set, tt.e, !tt.want, tt.want)
		}
	}
	for _, e := range p.Elements() {
		if _, ok := SetByName(e.Set); !ok {
			t.Errorf("element of unknown set %q", e.Set)
		}
	}
}

func TestPlannerReusesUnchangedFragments(t *testing.T) {
	st := demoState()
	pl := NewPlanner(Config{})
	first := pl.Plan(st, nodeAddrs)
	dns := spn("kube-system", "kube-dns", "dns")
	web := spn("shop", "web", "http")
	// A plan is valid until the next: keep what is compared.
	firstWeb, firstDNS := first.Services[web], first.Services[dns]

	next := model.NewState()
	next.Node = st.Node
	for n, s := range st.Services.All() {
		next.Services, next.Endpoints = next.Services.With(n, s), next.Endpoints.With(n, st.Endpoints.Get(n))
	}
	next.Endpoints = next.Endpoints.With(dns, append([]model.Endpoint(nil), st.Endpoints.Get(dns)[:1]...))
	second := pl.Plan(next, nodeAddrs)
	if second.Services[web] != firstWeb {
		t.Error("unchanged service port got a new fragment")
	}
	if second.Services[dns] == firstDNS || second.Services[dns].Equal(firstDNS) {
		t.Error("changed endpoints kept the old fragment")
	}
	if len(second.changed) != 1 || second.changed[0] != dns || second.prevSeq != first.seq {
		t.Errorf("second plan names %v as changed since plan %d, want [%s] since %d", second.changed, second.prevSeq, dns, first.seq)
	}
	secondWeb := second.Services[web]
	if got, want := second.String(), BuildPlan(next, Config{}, nodeAddrs).String(); got != want {
		t.Errorf("incremental plan differs from a fresh one:\n%s\nfresh:\n%s", got, want)
	}
	// New node addresses change NodePort servers: nothing is reused.
	third := pl.Plan(next, nodeAddrs[:1])
	if third.Services[web] == secondWeb || third.prevSeq != 0 {
		t.Error("fragment reused across a change of node addresses")
	}
	// Service ports removed are named as changed; the plan equals a fresh one.
	fourth := model.NewState()
	fourth.Node = next.Node
	for n, s := range next.Services.All() {
		if n != web {
			fourth.Services, fourth.Endpoints = fourth.Services.With(n, s), fourth.Endpoints.With(n, next.Endpoints.Get(n))
		}
	}
	p4 := pl.Plan(fourth, nodeAddrs[:1])
	if !slices.Contains(p4.changed, web) || p4.Services[web] != nil {
		t.Errorf("removed %s: changed %v", web, p4.changed)
	}
	if got, want := p4.String(), BuildPlan(fourth, Config{}, nodeAddrs[:1]).String(); got != want {
		t.Errorf("plan after a removal differs from a fresh one:\n%s\nfresh:\n%s", got, want)
	}
}

// Node access to an LB IP with source ranges, as upstream: allowed when a
// range holds the node's primary address of the family (the LB IP itself in
// a range does not count), else the node's requests, from the LB IP, drop.
func TestPlanLBNodeAccess(t *testing.T) {
	n := spn("ns", "lb", "http")
	lb := ip("203.0.113.20")
	for _, tt := range []struct {
		name   string
		ranges []string
		node   []netip.Addr
		allow  bool
	}{
		{"a range holds the primary node IP", []string{"10.99.0.0/24"}, []netip.Addr{ip("10.99.0.1")}, true},
		{"no range holds the node", []string{"10.99.0.2/32"}, []netip.Addr{ip("10.99.0.1")}, false},
		{"a range holds the LB IP, not the node", []string{"10.99.0.2/32", "203.0.113.0/24"}, []netip.Addr{ip("10.99.0.1")}, false},
		{"a range holds a secondary node IP only", []string{"172.17.0.0/16"}, []netip.Addr{ip("10.99.0.1"), ip("172.17.0.1")}, false},
		{"the first IPv4 address is the primary one", []string{"172.17.0.0/16"}, []netip.Addr{ip("fd00:99::1"), ip("172.17.0.1"), ip("10.99.0.1")}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := model.NewState()
			st.Node = model.Node{Name: node, IPs: tt.node}
			var ranges []netip.Prefix
			for _, r := range tt.ranges {
				ranges = append(ranges, netip.MustParsePrefix(r))
			}
			st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.TCP, Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.50")},
				LoadBalancerIPs: []netip.Addr{lb}, LoadBalancerSourceRanges: ranges})
			elems := BuildPlan(st, Config{}, nodeAddrs).Elements()
			self := Element{Set: SetLBSourceIP, Addr: lb, Protocol: model.TCP, Port: 80, Addr2: lb}
			deny := self
			deny.Set = SetLBNoNodeAccess
			if got := slices.Contains(elems, self); got != tt.allow {
				t.Errorf("%s element present: %v, want %v", SetLBSourceIP, got, tt.allow)
			}
			if got := slices.Contains(elems, deny); got == tt.allow {
				t.Errorf("%s element present: %v, want %v", SetLBNoNodeAccess, got, !tt.allow)
			}
			for _, r := range ranges {
				if !slices.Contains(elems, Element{Set: SetLBSourceCIDR, Addr: lb, Protocol: model.TCP, Port: 80, Net: r}) {
					t.Errorf("range %s not in %s", r, SetLBSourceCIDR)
				}
			}
		})
	}
}

// With a State that says what changed since the one planned last, the
// Planner looks at those service ports alone and still plans what a fresh
// Planner would; a gap in the State generations or another lineage falls
// back to comparing every one.
func TestPlannerFollowsStateChanges(t *testing.T) {
	lin := &model.Lineage{}
	st := demoState()
	st.Changes = model.StateChanges{Lineage: lin, Gen: 1, NodeChanged: true}
	pl := NewPlanner(Config{})
	pl.Plan(st, nodeAddrs)

	dns := spn("kube-system", "kube-dns", "dns")
	web := spn("shop", "web", "http")
	next := model.NewState()
	next.Node = st.Node
	for n, s := range st.Services.All() {
		if n != web {
			next.Services, next.Endpoints = next.Services.With(n, s), next.Endpoints.With(n, st.Endpoints.Get(n))
		}
	}
	next.Endpoints = next.Endpoints.With(dns, append([]model.Endpoint(nil), st.Endpoints.Get(dns)[:1]...))
	next.Changes = model.StateChanges{Lineage: lin, Gen: 2, Ports: []model.ServicePortName{dns, web}}
	p := pl.Plan(next, nodeAddrs)
	if got, want := p.String(), BuildPlan(next, Config{}, nodeAddrs).String(); got != want {
		t.Errorf("plan from the State's changes differs from a fresh one:\n%s\nfresh:\n%s", got, want)
	}
	if !slices.Contains(p.changed, dns) || !slices.Contains(p.changed, web) || len(p.changed) != 2 {
		t.Errorf("changed: %v, want %s and %s", p.changed, dns, web)
	}
	// Changes that lie (they leave web's return out) are believed: which
	// is why only a source that tracks its changes sets them. A gap in the
	// State generations is not: everything is compared.
	back := demoState()
	back.Changes = model.StateChanges{Lineage: lin, Gen: 4}
	if got, want := pl.Plan(back, nodeAddrs).String(), BuildPlan(back, Config{}, nodeAddrs).String(); got != want {
		t.Errorf("after a gap in the State generations:\n%s\nfresh:\n%s", got, want)
	}
}
