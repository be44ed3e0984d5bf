package conntrack

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

var (
	dnsName  = model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}
	tcpName  = model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	sctpName = model.ServicePortName{Namespace: "default", Name: "sig", Port: "sctp"}
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func ep(addr string, port uint16, ready, serving bool) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: port, Ready: ready, Serving: serving}
}

// state: a UDP DNS service (cluster IP, external IP, LB IP, NodePort 30053),
// a TCP service on the same cluster IP port, an SCTP service.
func state(dnsEndpoints ...model.Endpoint) *model.State {
	st := model.NewState()
	st.Services = st.Services.With(dnsName, &model.ServicePort{Name: dnsName, Protocol: model.UDP, Port: 53, NodePort: 30053,
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::a")},
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.10")}})
	st.Endpoints = st.Endpoints.With(dnsName, dnsEndpoints)
	st.Services = st.Services.With(tcpName, &model.ServicePort{Name: tcpName, Protocol: model.TCP, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")}})
	st.Endpoints = st.Endpoints.With(tcpName, []model.Endpoint{ep("10.244.1.9", 8080, true, true)})
	st.Services = st.Services.With(sctpName, &model.ServicePort{Name: sctpName, Protocol: model.SCTP, Port: 9,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.30")}})
	st.Endpoints = st.Endpoints.With(sctpName, []model.Endpoint{ep("10.244.1.7", 9, true, true)})
	return st
}

func udp(src, dst, replySrc string) Flow {
	return Flow{Proto: protoUDP, OrigSrc: ap(src), OrigDst: ap(dst), ReplySrc: ap(replySrc)}
}

var nodeIP = netip.MustParseAddr("172.18.0.2")

func TestStale(t *testing.T) {
	a := ep("10.244.1.5", 53, true, true)
	b := ep("10.244.2.5", 53, true, true)
	terminatingServing := ep("10.244.3.5", 53, false, true)
	notServing := ep("10.244.4.5", 53, false, false)
	withAB := state(a, b)
	none := state()
	gone := model.NewState()
	portChanged := state(a, b)
	portChanged.Services.Get(dnsName).Port = 5353

	tests := []struct {
		name      string
		prev, cur *model.State
		flow      Flow
		want      bool
	}{
		{"to a live endpoint", withAB, withAB, udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), false},
		{"to a removed endpoint", withAB, state(b), udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
		{"the endpoint's port changed", withAB, state(ep("10.244.1.5", 5353, true, true), b), udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
		{"to a terminating endpoint that still serves", withAB, state(b, terminatingServing), udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.3.5:53"), false},
		{"to an endpoint that no longer serves", withAB, state(b, notServing), udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.4.5:53"), true},
		{"service lost all endpoints", withAB, none, udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
		{"service deleted", withAB, gone, udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
		{"service port changed: the old port is gone", withAB, portChanged, udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
		{"not DNATed, service got endpoints", none, withAB, udp("10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"), true},
		{"not DNATed, service still without endpoints", none, none, udp("10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"), false},
		{"not DNATed, deleted service", withAB, gone, udp("10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"), false},
		{"IPv6 cluster IP to a removed endpoint", state(ep("fd00:244::5", 53, true, true)), state(ep("fd00:244::6", 53, true, true)), udp("[fd00:244::9]:40000", "[fd00::a]:53", "[fd00:244::5]:53"), true},
		{"IPv6 to a live endpoint", state(ep("fd00:244::5", 53, true, true)), state(ep("fd00:244::5", 53, true, true)), udp("[fd00:244::9]:40000", "[fd00::a]:53", "[fd00:244::5]:53"), false},
		{"external IP to a removed endpoint", withAB, state(b), udp("203.0.113.1:40000", "192.0.2.10:53", "10.244.1.5:53"), true},
		{"LB IP, not DNATed, got endpoints", none, withAB, udp("203.0.113.1:40000", "198.51.100.10:53", "198.51.100.10:53"), true},
		{"NodePort to a removed endpoint", withAB, state(b), udp("203.0.113.1:40000", "172.18.0.2:30053", "10.244.1.5:53"), true},
		{"NodePort to a live endpoint", withAB, state(a), udp("203.0.113.1:40000", "172.18.0.2:30053", "10.244.1.5:53"), false},
		{"NodePort, not DNATed, got endpoints", none, withAB, udp("203.0.113.1:40000", "172.18.0.2:30053", "172.18.0.2:30053"), true},
		{"NodePort port on a non-local address is not ours", none, withAB, udp("10.244.9.9:40000", "203.0.113.7:30053", "203.0.113.7:30053"), false},
		{"other UDP traffic", withAB, state(b), udp("10.244.9.9:40000", "10.96.0.99:53", "10.244.1.5:53"), false},
		{"other port of the cluster IP", none, withAB, udp("10.244.9.9:40000", "10.96.0.10:54", "10.96.0.10:54"), false},
		{"TCP is never touched", withAB, gone, Flow{Proto: 6, OrigSrc: ap("10.244.9.9:40000"), OrigDst: ap("10.96.0.20:80"), ReplySrc: ap("10.244.7.7:8080")}, false},
		{"SCTP to a removed endpoint", withAB, func() *model.State { s := state(a, b); s.Endpoints = s.Endpoints.With(sctpName, nil); return s }(), Flow{Proto: protoSCTP, OrigSrc: ap("10.244.9.9:40000"), OrigDst: ap("10.96.0.30:9"), ReplySrc: ap("10.244.1.7:9")}, true},
		{"first sync: stale against the state alone", nil, state(b), udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prev *Targets
			if tt.prev != nil {
				prev = NewTargets(tt.prev)
			}
			j := NewJudge(prev, NewTargets(tt.cur), []netip.Addr{nodeIP})
			if got := j.Stale(tt.flow); got != tt.want {
				t.Errorf("Stale(%+v) = %v, want %v", tt.flow, got, tt.want)
			}
		})
	}
}

func TestNeedsScan(t *testing.T) {
	a := ep("10.244.1.5", 53, true, true)
	b := ep("10.244.2.5", 53, true, true)
	tests := []struct {
		name      string
		prev, cur *model.State
		want      bool
	}{
		{"first sync", nil, state(a), true},
		{"nothing changed", state(a, b), state(a, b), false},
		{"an endpoint added", state(a), state(a, b), false},
		{"an endpoint removed", state(a, b), state(a), true},
		{"first endpoints", state(), state(a), true},
		{"service deleted", state(a), model.NewState(), true},
		{"only TCP changed", state(a), func() *model.State { s := state(a); s.Endpoints = s.Endpoints.With(tcpName, nil); return s }(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prev *Targets
			if tt.prev != nil {
				prev = NewTargets(tt.prev)
			}
			if got := NeedsScan(prev, NewTargets(tt.cur)); got != tt.want {
				t.Errorf("NeedsScan = %v, want %v", got, tt.want)
			}
		})
	}
}

// fakeTable is a conntrack table in memory.
type fakeTable struct {
	flows []Flow
	lists int
}

func (f *fakeTable) List(family, proto uint8) ([]Flow, error) {
	f.lists++
	var out []Flow
	for _, fl := range f.flows {
		if fl.Proto == proto && (family == 0 || fl.OrigSrc.Addr().Is4() == (family == 2)) {
			out = append(out, fl)
		}
	}
	return out, nil
}

func (f *fakeTable) Delete(del []Flow) (int, error) {
	n := 0
	for _, d := range del {
		for i, fl := range f.flows {
			if fl == d {
				f.flows = append(f.flows[:i], f.flows[i+1:]...)
				n++
				break
			}
		}
	}
	return n, nil
}

func TestCleanerScansOnlyWhenNeeded(t *testing.T) {
	a := ep("10.244.1.5", 53, true, true)
	b := ep("10.244.2.5", 53, true, true)
	toA := udp("10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:53")
	toB := udp("10.244.9.9:40001", "10.96.0.10:53", "10.244.2.5:53")
	table := &fakeTable{flows: []Flow{toA, toB}}
	c := &Cleaner{Table: table, LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{nodeIP}, nil }}

	steps := []struct {
		st      *model.State
		scanned bool
		deleted int
	}{
		{state(a, b), true, 0},  // first sync reads the table
		{state(a, b), false, 0}, // nothing changed
		{state(b), true, 1},     // a removed: its flow goes
		{state(b), false, 0},
	}
	for i, s := range steps {
		res, err := c.Clean(s.st)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if res.Scanned != s.scanned || res.Deleted != s.deleted {
			t.Errorf("step %d: scanned %v, deleted %d; want %v, %d", i, res.Scanned, res.Deleted, s.scanned, s.deleted)
		}
	}
	if len(table.flows) != 1 || table.flows[0] != toB {
		t.Errorf("left %v, want only the flow to b", table.flows)
	}
	// FullEvery reads the table again although nothing changed.
	c.FullEvery = time.Nanosecond
	if res, _ := c.Clean(state(b)); !res.Scanned {
		t.Errorf("FullEvery elapsed but the table was not read")
	}
}
