package kube

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// serviceKey names a Service: the EndpointSlice label points at it.
type serviceKey struct{ namespace, name string }

func (k serviceKey) String() string { return k.namespace + "/" + k.name }

// sliceInfo is the part of an EndpointSlice the proxy uses, parsed and
// validated once when the slice arrives.
type sliceInfo struct {
	name      string // the slice's own name, for a stable merge order
	service   serviceKey
	ports     []slicePort
	endpoints []model.Endpoint // Port is filled in per service port
}

type slicePort struct {
	name  string
	proto model.Protocol
	port  uint16
}

// parseEndpointSlice validates a slice. (nil, nil) means the proxy ignores
// it (FQDN addresses, headless or foreign-proxy labels); (nil, err) means it
// is unusable; (info, err) means some endpoints or ports were dropped.
func parseEndpointSlice(es *discoveryv1.EndpointSlice) (*sliceInfo, error) {
	if es == nil || ignoredSlice(es) {
		return nil, nil
	}
	ns := NamespaceOrDefault(es.Namespace)
	p := &problems{kind: "endpointslice", namespace: ns, name: es.Name}
	if es.Name == "" {
		p.add("metadata.name is empty")
		return nil, p.err()
	}
	svcName := es.Labels[discoveryv1.LabelServiceName]
	if svcName == "" {
		p.add("no %s label, slice skipped", discoveryv1.LabelServiceName)
		return nil, p.err()
	}
	var wantV4 bool
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		wantV4 = true
	case discoveryv1.AddressTypeIPv6:
	default:
		p.add("unknown addressType %q, slice skipped", es.AddressType)
		return nil, p.err()
	}

	// Sized up front: grown by append, the lists of the Builder's largest
	// holding would carry up to 60% spare capacity.
	info := &sliceInfo{name: es.Name, service: serviceKey{ns, svcName},
		endpoints: make([]model.Endpoint, 0, len(es.Endpoints))}
	for i, ep := range es.Ports {
		label := "ports[" + strconv.Itoa(i) + "]"
		if ep.Port == nil {
			// nil means "all ports", which no proxy implements; not an error.
			continue
		}
		port, ok := port16(*ep.Port)
		if !ok {
			p.add("%s: port %d out of range 1-65535, port skipped", label, *ep.Port)
			continue
		}
		proto := model.TCP
		if ep.Protocol != nil {
			var err error
			if proto, err = model.ParseProtocol(string(*ep.Protocol)); err != nil {
				p.add("%s: %v, port skipped", label, err)
				continue
			}
		}
		sp := slicePort{proto: proto, port: port}
		if ep.Name != nil {
			sp.name = *ep.Name
		}
		info.ports = append(info.ports, sp)
	}

	info.endpoints = parseEndpoints(es, wantV4, info.endpoints, p)
	// The usual slice has one port: with it filled in, mergeEndpoints can
	// often hand out this very list (see shareable).
	if len(info.ports) == 1 {
		for i := range info.endpoints {
			info.endpoints[i].Port = info.ports[0].port
		}
	}
	return info, p.err()
}

// parseEndpoints appends the slice's usable endpoints to eps, reporting
// the others.
func parseEndpoints(es *discoveryv1.EndpointSlice, wantV4 bool, eps []model.Endpoint, p *problems) []model.Endpoint {
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		label := "endpoints[" + strconv.Itoa(i) + "]"
		if len(e.Addresses) == 0 {
			p.add("%s: no addresses, endpoint skipped", label)
			continue
		}
		// Only the first address counts: the API reserves the others.
		addr, err := parseIP(e.Addresses[0])
		if err != nil {
			p.add("%s: %v, endpoint skipped", label, err)
			continue
		}
		if why := notForEndpoint(addr); why != "" {
			p.add("%s: address %s is %s, endpoint skipped", label, addr, why)
			continue
		}
		if addr.Is4() != wantV4 {
			p.add("%s: address %s does not match addressType %s, endpoint skipped", label, addr, es.AddressType)
			continue
		}
		eps = append(eps, convertEndpoint(addr, e))
	}
	return eps
}

func ignoredSlice(es *discoveryv1.EndpointSlice) bool {
	if es.AddressType == discoveryv1.AddressTypeFQDN {
		return true
	}
	if _, ok := es.Labels[LabelServiceProxyName]; ok {
		return true
	}
	_, ok := es.Labels[LabelHeadless]
	return ok
}

func convertEndpoint(addr netip.Addr, e *discoveryv1.Endpoint) model.Endpoint {
	// Unset conditions read as upstream kube-proxy reads them: ready and
	// serving true, terminating false. Serving does not follow ready: an
	// endpoint marked not ready with serving unset still counts as serving.
	c := e.Conditions
	out := model.Endpoint{
		Addr:        addr,
		Ready:       c.Ready == nil || *c.Ready,
		Serving:     c.Serving == nil || *c.Serving,
		Terminating: c.Terminating != nil && *c.Terminating,
	}
	if e.NodeName != nil {
		out.NodeName = *e.NodeName
	}
	if e.Zone != nil {
		out.Zone = *e.Zone
	}
	if e.Hints != nil {
		out.ZoneHints = hintNames(e.Hints.ForZones, func(z discoveryv1.ForZone) string { return z.Name })
		out.NodeHints = hintNames(e.Hints.ForNodes, func(n discoveryv1.ForNode) string { return n.Name })
	}
	return out
}

// hintNames is the sorted set of the hints' names; nil for none.
func hintNames[H any](hints []H, name func(H) string) []string {
	if len(hints) == 0 {
		return nil
	}
	out := make([]string, 0, len(hints))
	for _, h := range hints {
		if n := name(h); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// mergeEndpoints builds the endpoints of a Service's ports from all its
// slices. Slice ports match service ports by name and protocol. The same
// ip:port may sit in several slices (a pod moving between slices is briefly
// in both); one copy is kept, preferring one that says it runs on this node
// so local-traffic policies never lose it, and otherwise the copy from the
// first slice by name, so the result does not depend on arrival order.
func mergeEndpoints(ports []*model.ServicePort, infos []*sliceInfo, nodeName string) map[model.ServicePortName][]model.Endpoint {
	out := map[model.ServicePortName][]model.Endpoint{}
	for _, pe := range mergeEndpointList(ports, infos, nodeName) {
		out[pe.name] = pe.eps
	}
	return out
}

// portEndpoints are the merged endpoints of one service port.
type portEndpoints struct {
	name model.ServicePortName
	eps  []model.Endpoint
}

// mergeEndpointList is mergeEndpoints as a list, in the order of ports,
// never nil: what the Builder keeps per Service, where a map of one or
// two entries would cost about 600 bytes.
func mergeEndpointList(ports []*model.ServicePort, infos []*sliceInfo, nodeName string) []portEndpoints {
	infos = slices.Clone(infos)
	slices.SortFunc(infos, func(a, b *sliceInfo) int { return cmp.Compare(a.name, b.name) })

	out := make([]portEndpoints, 0, len(ports))
	for _, sp := range ports {
		// Sized for every candidate (usually all of them are kept): the
		// merged lists are the largest thing the Builder holds.
		size, matches := 0, 0
		var only *sliceInfo
		for _, info := range infos {
			for _, p := range info.ports {
				if p.name == sp.Name.Port && p.proto == sp.Protocol {
					size += len(info.endpoints)
					matches++
					only = info
				}
			}
		}
		if size == 0 {
			continue
		}
		if matches == 1 && shareable(only) {
			out = append(out, portEndpoints{sp.Name, slices.Clip(only.endpoints)})
			continue
		}
		byAddr := make(map[netip.AddrPort]int, size) // index into eps
		eps := make([]model.Endpoint, 0, size)
		for _, info := range infos {
			for _, p := range info.ports {
				if p.name != sp.Name.Port || p.proto != sp.Protocol {
					continue
				}
				for _, e := range info.endpoints {
					e.Port = p.port
					key := netip.AddrPortFrom(e.Addr, e.Port)
					i, seen := byAddr[key]
					switch {
					case !seen:
						byAddr[key] = len(eps)
						eps = append(eps, e)
					case e.IsLocal(nodeName) && !eps[i].IsLocal(nodeName):
						eps[i] = e
					}
				}
			}
		}
		if len(eps) == 0 {
			continue
		}
		slices.SortFunc(eps, func(a, b model.Endpoint) int {
			if c := a.Addr.Compare(b.Addr); c != 0 {
				return c
			}
			return cmp.Compare(a.Port, b.Port)
		})
		out = append(out, portEndpoints{sp.Name, eps})
	}
	return out
}

// shareable reports whether a slice's endpoints are already what merging
// them alone gives: their port filled in (a single-port slice) and sorted
// by address without repeats. Then the merged list is the slice's own,
// which is never modified (parseEndpointSlice makes a new one for every
// version of the slice), rather than a copy of every endpoint.
func shareable(info *sliceInfo) bool {
	if len(info.ports) != 1 {
		return false
	}
	for i := 1; i < len(info.endpoints); i++ {
		if info.endpoints[i-1].Addr.Compare(info.endpoints[i].Addr) >= 0 {
			return false
		}
	}
	return true
}

// EndpointsForService merges the EndpointSlices of the Service whose ports
// are given. Slices of other Services, ignored slices and invalid parts of
// slices are left out; the error says what was dropped. nodeName is this
// node, used to prefer the local copy of a duplicated endpoint.
func EndpointsForService(ports []*model.ServicePort, endpointSlices []*discoveryv1.EndpointSlice, nodeName string) (map[model.ServicePortName][]model.Endpoint, error) {
	if len(ports) == 0 {
		return map[model.ServicePortName][]model.Endpoint{}, nil
	}
	want := serviceKey{ports[0].Name.Namespace, ports[0].Name.Name}
	var errs []error
	var infos []*sliceInfo
	for _, es := range endpointSlices {
		info, err := parseEndpointSlice(es)
		errs = append(errs, SplitErrors(err)...)
		if info == nil {
			continue
		}
		if info.service != want {
			errs = append(errs, &ObjectError{
				Kind: "endpointslice", Namespace: info.service.namespace, Name: info.name,
				Err: fmt.Errorf("belongs to service %s, not %s; skipped", info.service, want),
			})
			continue
		}
		infos = append(infos, info)
	}
	return mergeEndpoints(ports, infos, nodeName), errors.Join(errs...)
}
