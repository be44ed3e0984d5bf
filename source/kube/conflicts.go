package kube

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Conflicts between Services.
//
// The kernel holds a map element once per key and refuses a whole
// transaction that adds a second element with a key already there, so two
// Services asking for one key would stop every update. Two kinds of key are
// shared by all Services: a NodePort with its protocol, and an address with
// a protocol and port, whether the address is a cluster IP, an external IP
// or a load balancer IP (any mix collides). The Builder resolves each key
// when a Service comes, changes or goes: the Service that ranks first keeps
// the value, the others go without that one value and are reported, and a
// loser gets its value back as soon as the holder lets it go.
//
// Who keeps a key depends on the Services asking for it alone, never on
// the order they came in or on who held it before: a proxy that saw them
// come one by one, a restarted one and render all agree, so a restart never
// moves a value. One rule comes first: a cluster IP keeps its address
// against an external or load balancer IP. Then the older Service keeps
// it, which is the one the API server would have kept; a Service without a
// creation time (hand-written in a state file) counts as the newest, so it
// never takes a value from one that has a time; then namespace, then name.
// The API server gives a new Service a later creation time than every
// existing one, so a new Service takes a value only from one created in
// the same second with a later name; an older Service that asks for a
// value later (an external IP added) takes it.

// claim is a key shared by all Services: an address, protocol and port, or
// a NodePort, protocol and IP family (addr not valid; ipv6 set for IPv6).
// A NodePort is programmed per family, in each family the Service has a
// cluster IP of, so it only collides within a family.
type claim struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
	ipv6  bool
}

func (c claim) String() string {
	if !c.addr.IsValid() {
		return strconv.Itoa(int(c.port)) + "/" + string(c.proto)
	}
	return netip.AddrPortFrom(c.addr, c.port).String() + "/" + string(c.proto)
}

// programmedNodePortClaims lists the NodePort keys sp is programmed with:
// those of nodePortClaims that no other Service holds.
func programmedNodePortClaims(sp *model.ServicePort) []claim {
	return slices.DeleteFunc(nodePortClaims(sp), func(c claim) bool { return sp.NodePortIn(c.ipv6) == 0 })
}

// nodePortClaims lists the NodePort keys of sp: one per family of its
// cluster IPs.
func nodePortClaims(sp *model.ServicePort) []claim {
	var out []claim
	for _, v6 := range []bool{false, true} {
		if slices.ContainsFunc(sp.ClusterIPs, func(ip netip.Addr) bool { return ip.Unmap().Is6() == v6 }) {
			out = append(out, claim{proto: sp.Protocol, port: sp.NodePort, ipv6: v6})
		}
	}
	return out
}

// role is how a service port uses a claimed key.
type role uint8

const (
	roleClusterIP role = iota
	roleExternalIP
	roleLoadBalancerIP
	roleNodePort
)

func (r role) String() string {
	switch r {
	case roleClusterIP:
		return "cluster IP"
	case roleExternalIP:
		return "external IP"
	case roleLoadBalancerIP:
		return "load balancer IP"
	}
	return "NodePort"
}

// claimUse is one key a Service asks for and which of its values asks.
type claimUse struct {
	key  claim
	port int // index into serviceEntry.ports
	role role
}

// serviceEntry is one Service as the Builder holds it.
type serviceEntry struct {
	key     serviceKey
	created time.Time
	// ports are the converted ports; effective are what goes into the
	// state: ports without the values other Services hold. The two share
	// the ServicePorts that lost nothing.
	ports     []*model.ServicePort
	effective []*model.ServicePort
	claims    []claimUse
	// endpoints caches the merged endpoints; nil until computed.
	endpoints []portEndpoints
	// pending is set while the entry waits in Builder.pending.
	pending bool
}

func newServiceEntry(key serviceKey, created time.Time, ports []*model.ServicePort) *serviceEntry {
	e := &serviceEntry{key: key, created: created, ports: ports, effective: ports}
	seen := map[claim]bool{}
	use := func(c claim, port int, r role) {
		// ServicePorts leaves no key twice in one Service; should one slip
		// through, the first use keeps it and the others are left out.
		if !seen[c] {
			seen[c] = true
			e.claims = append(e.claims, claimUse{key: c, port: port, role: r})
		}
	}
	for i, sp := range ports {
		for _, ip := range sp.ClusterIPs {
			use(claim{addr: ip, proto: sp.Protocol, port: sp.Port}, i, roleClusterIP)
		}
		for _, ip := range sp.ExternalIPs {
			use(claim{addr: ip, proto: sp.Protocol, port: sp.Port}, i, roleExternalIP)
		}
		for _, ip := range sp.LoadBalancerIPs {
			use(claim{addr: ip, proto: sp.Protocol, port: sp.Port}, i, roleLoadBalancerIP)
		}
		if sp.NodePort != 0 {
			for _, c := range nodePortClaims(sp) {
				use(c, i, roleNodePort)
			}
		}
	}
	return e
}

// outranks reports whether e keeps a key that o also asks for: the older
// Service (one without a creation time after all that have one), then the
// first by namespace and name.
func (e *serviceEntry) outranks(o *serviceEntry) bool {
	switch {
	case e.created.IsZero() != o.created.IsZero():
		return o.created.IsZero()
	case !e.created.Equal(o.created):
		return e.created.Before(o.created)
	case e.key.namespace != o.key.namespace:
		return e.key.namespace < o.key.namespace
	}
	return e.key.name < o.key.name
}

// outranksFor reports whether e keeps key c against o. A cluster IP always
// keeps its address against an external or load balancer IP: otherwise a
// Service could take over another's cluster IP by listing it as its
// external IP (the pattern of CVE-2020-8554). Else outranks decides.
func outranksFor(e, o *serviceEntry, c claim) bool {
	eu, _ := e.use(c)
	ou, _ := o.use(c)
	if ec, oc := eu.role == roleClusterIP, ou.role == roleClusterIP; ec != oc {
		return ec
	}
	return e.outranks(o)
}

// use returns how e uses key c.
func (e *serviceEntry) use(c claim) (claimUse, bool) {
	for _, u := range e.claims {
		if u.key == c {
			return u, true
		}
	}
	return claimUse{}, false
}

// ConflictError is a value two Services ask for. Builder.Errors wraps it
// in an ObjectError naming the loser's Service. The holder keeps the value;
// the loser goes without it until the holder lets it go.
type ConflictError struct {
	Loser, Holder         model.ServicePortName
	LoserRole, HolderRole string // "cluster IP", "external IP", "load balancer IP" or "NodePort"
	Key                   string // "10.96.0.10:80/TCP" or, for a NodePort, "30080/TCP"
}

func (e *ConflictError) Error() string {
	var prefix string
	if e.Loser.Port != "" {
		prefix = "port " + strconv.Quote(e.Loser.Port) + ": "
	}
	holder := "service " + ObjectName(e.Holder.Namespace, e.Holder.Name)
	if e.Holder.Port != "" {
		holder += " port " + strconv.Quote(e.Holder.Port)
	}
	return fmt.Sprintf("%s%s %s conflicts with the %s of %s, which keeps it; dropped",
		prefix, e.LoserRole, e.Key, e.HolderRole, holder)
}

// addClaims registers every key e asks for, taking over those it outranks
// the holder of.
func (b *Builder) addClaims(e *serviceEntry) {
	for _, u := range e.claims {
		c := u.key
		holder, held := b.owner[c]
		switch {
		case !held:
			b.owner[c] = e
		case outranksFor(e, holder, c):
			b.owner[c] = e
			b.rivals[c] = append(b.rivals[c], holder)
			// The old holder loses the value; the others' messages name
			// the holder.
			b.markPending(b.rivals[c]...)
		default:
			b.rivals[c] = append(b.rivals[c], e)
		}
	}
	b.markPending(e)
}

// removeClaims lets go of every key e asks for, handing each it held to the
// best-ranked rival.
func (b *Builder) removeClaims(e *serviceEntry) {
	for _, u := range e.claims {
		c := u.key
		rivals := b.rivals[c]
		if b.owner[c] != e {
			if i := slices.Index(rivals, e); i >= 0 {
				rivals = slices.Delete(rivals, i, i+1)
			}
		} else if len(rivals) == 0 {
			delete(b.owner, c)
		} else {
			best := 0
			for i, r := range rivals[1:] {
				if outranksFor(r, rivals[best], c) {
					best = i + 1
				}
			}
			b.owner[c] = rivals[best]
			rivals = slices.Delete(rivals, best, best+1)
			b.markPending(b.owner[c])
			b.markPending(rivals...)
		}
		if len(rivals) == 0 {
			delete(b.rivals, c)
		} else {
			b.rivals[c] = rivals
		}
	}
}

// markPending queues entries whose effective ports and conflict reports
// need another look.
func (b *Builder) markPending(es ...*serviceEntry) {
	for _, e := range es {
		if !e.pending {
			e.pending = true
			b.pending = append(b.pending, e)
		}
	}
}

// resolvePending brings every queued entry up to date.
func (b *Builder) resolvePending() {
	for _, e := range b.pending {
		e.pending = false
		if b.services[e.key] == e { // not replaced or deleted meanwhile
			b.resolve(e)
		}
	}
	clear(b.pending)
	b.pending = b.pending[:0]
}

// resolve recomputes e's effective ports and conflict reports from the
// current holders of its keys, and queues e for the next State if its
// effective ports changed.
func (b *Builder) resolve(e *serviceEntry) {
	ref := objectRef{"service", e.key.namespace, e.key.name}
	effective := e.ports
	var errs []error
	for _, u := range e.claims {
		holder := b.owner[u.key]
		if holder == e {
			continue
		}
		if len(errs) == 0 {
			effective = slices.Clone(e.ports)
		}
		if effective[u.port] == e.ports[u.port] {
			sp := *e.ports[u.port]
			effective[u.port] = &sp
		}
		dropValue(effective[u.port], u)
		hu, _ := holder.use(u.key)
		errs = append(errs, &ObjectError{
			Kind: ref.kind, Namespace: ref.namespace, Name: ref.name,
			Err: &ConflictError{
				Loser: e.ports[u.port].Name, Holder: holder.ports[hu.port].Name,
				LoserRole: u.role.String(), HolderRole: hu.role.String(), Key: u.key.String(),
			},
		})
	}
	if len(errs) == 0 {
		delete(b.conflicts, ref)
	} else {
		b.conflicts[ref] = errs
	}
	if !slices.EqualFunc(effective, e.effective, (*model.ServicePort).Equal) {
		e.effective = effective
		b.markDirty(e.key)
	}
}

// dropValue removes the value u names from sp, a copy the caller owns. The
// address lists may be shared with other ports, so they are replaced, not
// edited.
func dropValue(sp *model.ServicePort, u claimUse) {
	without := func(ips []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, ip := range ips {
			if ip != u.key.addr {
				out = append(out, ip)
			}
		}
		return out
	}
	switch u.role {
	case roleClusterIP:
		sp.ClusterIPs = without(sp.ClusterIPs)
	case roleExternalIP:
		sp.ExternalIPs = without(sp.ExternalIPs)
	case roleLoadBalancerIP:
		sp.LoadBalancerIPs = without(sp.LoadBalancerIPs)
	case roleNodePort:
		// Only in the family of the claim: the Service keeps its
		// NodePort in a family where nobody else holds it.
		if u.key.ipv6 {
			sp.NodePortHeldV6 = true
		} else {
			sp.NodePortHeldV4 = true
		}
		if len(programmedNodePortClaims(sp)) == 0 {
			sp.NodePort, sp.NodePortHeldV4, sp.NodePortHeldV6 = 0, false, false
		}
	}
}
