package conntrack

import (
	"maps"
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// IP protocol numbers of the flows the cleaner looks at. TCP flows are never
// deleted: a TCP client notices a dead endpoint by itself (RST or timeout)
// and reconnects through the rules.
const (
	protoUDP  = 17
	protoSCTP = 132
)

// Flow is the part of one conntrack entry that the cleaner judges and needs
// to delete it.
type Flow struct {
	ID    uint32 // the kernel's id of the entry, so a delete hits this entry only
	Zone  uint16
	Proto uint8
	// Orig is the tuple as the client sent it: source and destination.
	OrigSrc, OrigDst netip.AddrPort
	// ReplySrc is where the flow really goes: the DNAT target, or OrigDst
	// when the flow was not DNATed.
	ReplySrc netip.AddrPort
}

// DNATed reports whether the kernel rewrote the flow's destination.
func (f Flow) DNATed() bool { return f.ReplySrc != f.OrigDst }

// targetKey is one place a Service port listens on: a cluster, external or
// load-balancer IP and port, or (with an invalid Addr) a NodePort.
type targetKey struct {
	proto uint8
	addr  netip.Addr
	port  uint16
}

// target is what a flow to a targetKey may be DNATed to now.
type target struct {
	name      model.ServicePortName   // the service port it is of
	endpoints map[netip.AddrPort]bool // serving endpoints of the service port
}

// Targets is, for the UDP and SCTP Service ports of one applied State, every
// address and NodePort they listen on and the endpoints that are valid
// behind it. It is the cleaner's whole knowledge of the Services.
type Targets struct {
	byKey map[targetKey]*target
}

// NewTargets collects the UDP and SCTP service ports of st. An endpoint is
// valid when it is ready or serving: flows to a terminating endpoint that
// still serves are left alone, as kube-proxy does, so they can finish.
func NewTargets(st *model.State) *Targets {
	t := &Targets{byKey: map[targetKey]*target{}}
	if st == nil {
		return t
	}
	for name, svc := range st.Services.All() {
		t.add(name, svc, st.Endpoints.Get(name))
	}
	return t
}

// add puts the keys of one service port in t (none for TCP).
func (t *Targets) add(name model.ServicePortName, svc *model.ServicePort, eps []model.Endpoint) {
	proto := protoNumber(svc.Protocol)
	if proto == 0 {
		return
	}
	tg := &target{name: name, endpoints: map[netip.AddrPort]bool{}}
	for _, ep := range eps {
		if ep.Ready || ep.Serving {
			tg.endpoints[netip.AddrPortFrom(ep.Addr, ep.Port)] = true
		}
	}
	for _, k := range keysOf(svc, proto) {
		t.byKey[k] = tg
	}
}

// keysOf lists where a service port listens.
func keysOf(svc *model.ServicePort, proto uint8) []targetKey {
	var out []targetKey
	for _, list := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs} {
		for _, a := range list {
			out = append(out, targetKey{proto, a.Unmap(), svc.Port})
		}
	}
	if svc.NodePort != 0 {
		out = append(out, targetKey{proto: proto, port: svc.NodePort})
	}
	return out
}

// Update returns the Targets of st, given that t are those of prev and
// changed the service ports that differ between the two
// (model.ChangeTracker). t is unchanged: a change that touches no UDP
// or SCTP service port returns t itself, any other costs a copy of t's
// keys (UDP and SCTP only) and the changed ports, not the whole State.
func (t *Targets) Update(prev, st *model.State, changed []model.ServicePortName) *Targets {
	var touched []model.ServicePortName
	for _, name := range changed {
		if isDatagram(prev.Services.Get(name)) || isDatagram(st.Services.Get(name)) {
			touched = append(touched, name)
		}
	}
	if len(touched) == 0 {
		return t
	}
	out := &Targets{byKey: maps.Clone(t.byKey)}
	for _, name := range touched {
		if old := prev.Services.Get(name); isDatagram(old) {
			for _, k := range keysOf(old, protoNumber(old.Protocol)) {
				if tg := out.byKey[k]; tg != nil && tg.name == name {
					delete(out.byKey, k)
				}
			}
		}
		if svc := st.Services.Get(name); svc != nil {
			out.add(name, svc, st.Endpoints.Get(name))
		}
	}
	return out
}

func isDatagram(svc *model.ServicePort) bool { return svc != nil && protoNumber(svc.Protocol) != 0 }

func protoNumber(p model.Protocol) uint8 {
	switch p {
	case model.UDP:
		return protoUDP
	case model.SCTP:
		return protoSCTP
	}
	return 0
}

// protocols lists the L4 protocols (UDP, SCTP) that t or prev listen on:
// only their flows need reading.
func (t *Targets) protocols(prev *Targets) []uint8 {
	seen := map[uint8]bool{}
	for _, tt := range []*Targets{t, prev} {
		if tt == nil {
			continue
		}
		for k := range tt.byKey {
			seen[k.proto] = true
		}
	}
	var out []uint8
	for _, p := range []uint8{protoUDP, protoSCTP} {
		if seen[p] {
			out = append(out, p)
		}
	}
	return out
}

// Judge decides which flows are stale after a sync from prev to cur.
type Judge struct {
	cur  *Targets
	gone map[targetKey]bool // listened on in prev, not in cur
	// local are the node's addresses: a flow to one of them on a NodePort
	// is a NodePort flow.
	local map[netip.Addr]bool
}

// NewJudge compares the targets of the previous and the current State.
// prev may be nil (first sync). local lists the node's own addresses.
func NewJudge(prev, cur *Targets, local []netip.Addr) *Judge {
	j := &Judge{cur: cur, gone: map[targetKey]bool{}, local: map[netip.Addr]bool{}}
	if prev != nil {
		for k := range prev.byKey {
			if cur.byKey[k] == nil {
				j.gone[k] = true
			}
		}
	}
	for _, a := range local {
		j.local[a.Unmap()] = true
	}
	return j
}

// Stale reports whether a flow must be deleted:
//   - it was DNATed to an address that is no longer a valid endpoint of the
//     service port it was sent to (or the service port is gone), so its
//     packets would keep going to a dead endpoint; or
//   - it was not DNATed, but was sent to a service port that has endpoints
//     now: it was created while there were none (and the packets were
//     rejected), and would keep bypassing the new DNAT rules.
//
// Flows to anything that is not a UDP or SCTP service port are never stale.
func (j *Judge) Stale(f Flow) bool {
	if f.Proto != protoUDP && f.Proto != protoSCTP {
		return false
	}
	dst := f.OrigDst.Addr().Unmap()
	key := targetKey{f.Proto, dst, f.OrigDst.Port()}
	tg := j.cur.byKey[key]
	if tg == nil && !j.gone[key] && j.local[dst] {
		key = targetKey{proto: f.Proto, port: f.OrigDst.Port()}
		tg = j.cur.byKey[key]
	}
	switch {
	case tg != nil && f.DNATed():
		return !tg.endpoints[netip.AddrPortFrom(f.ReplySrc.Addr().Unmap(), f.ReplySrc.Port())]
	case tg != nil:
		return len(tg.endpoints) > 0
	case j.gone[key]:
		// The service port (or this address of it) is gone: traffic to it
		// must not keep reaching its old endpoints.
		return f.DNATed()
	}
	return false
}

// NeedsScan reports whether anything changed between prev and cur that can
// leave stale flows behind: a service port lost an endpoint or went away, or
// gained its first endpoints. When nothing did, the conntrack table need not
// be read.
func NeedsScan(prev, cur *Targets) bool {
	switch {
	case prev == nil:
		return len(cur.byKey) > 0
	case prev == cur:
		return false
	}
	for k, was := range prev.byKey {
		now := cur.byKey[k]
		switch {
		case now == was:
			continue
		case now == nil:
			if len(was.endpoints) > 0 {
				return true
			}
			continue
		}
		if len(was.endpoints) == 0 && len(now.endpoints) > 0 {
			return true
		}
		for ep := range was.endpoints {
			if !now.endpoints[ep] {
				return true
			}
		}
	}
	for k, now := range cur.byKey {
		// A new address or NodePort with endpoints: flows to it from before
		// (not DNATed, perhaps rejected) must go.
		if prev.byKey[k] == nil && len(now.endpoints) > 0 {
			return true
		}
	}
	return false
}
