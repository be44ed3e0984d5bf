package kube

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// defaultAffinityTimeout is the API's default for
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
const defaultAffinityTimeout = 10800 * time.Second

// ServicePorts converts a Service into one ServicePort per spec.ports entry.
//
// (nil, nil) means kube-proxy ignores the Service (ExternalName, headless,
// owned by another proxy). (nil, err) means the Service cannot be programmed
// at all. (ports, err) means some values were dropped and err says which;
// the ports are still usable. The error may join several problems; see
// SplitErrors.
func ServicePorts(svc *corev1.Service) ([]*model.ServicePort, error) {
	ports, _, err := servicePorts(svc, false)
	return ports, err
}

// servicePorts is ServicePorts; with dropExternalIPs, spec.externalIPs are
// left out of the ports and returned as ignored instead (the valid ones,
// only when there are ports).
func servicePorts(svc *corev1.Service, dropExternalIPs bool) (ports []*model.ServicePort, ignored []netip.Addr, _ error) {
	if svc == nil || ignoredService(svc) {
		return nil, nil, nil
	}
	ns := NamespaceOrDefault(svc.Namespace)
	p := &problems{kind: "service", namespace: ns, name: svc.Name}
	if !checkServiceMeta(svc, ns, p) {
		return nil, nil, p.err()
	}
	clusterIPs, ok := serviceClusterIPs(svc, p)
	if !ok {
		return nil, nil, p.err()
	}
	tmpl, ignored := portTemplate(svc, clusterIPs, dropExternalIPs, p)
	ports = make([]*model.ServicePort, 0, len(svc.Spec.Ports))
	seen := newPortsSeen()
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		proto, port, nodePort, ok := seen.check(svc, sp, portLabel(sp.Name, i), p)
		if !ok {
			continue
		}
		out := tmpl // the slices are shared: nothing modifies a ServicePort
		out.Name = model.ServicePortName{Namespace: ns, Name: svc.Name, Port: sp.Name}
		out.Protocol = proto
		out.Port = port
		out.NodePort = nodePort
		ports = append(ports, &out)
	}
	if len(ports) == 0 {
		p.add("no valid ports, service skipped")
		return nil, nil, p.err()
	}
	return ports, ignored, p.err()
}

// checkServiceMeta checks what a Service needs before its ports are
// looked at: valid names and at least one port. A Service of unknown type
// is only noted (it is treated as ClusterIP).
func checkServiceMeta(svc *corev1.Service, ns string, p *problems) bool {
	if svc.Name == "" {
		p.add("metadata.name is empty")
		return false
	}
	// The API server allows nothing else; from a file, anything could come,
	// and the names end up in kernel objects (comments of at most 128 bytes).
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		p.add("metadata.namespace %q: %s, service skipped", ns, strings.Join(msgs, "; "))
		return false
	}
	if msgs := validation.IsDNS1123Label(svc.Name); len(msgs) > 0 {
		p.add("metadata.name %q: %s, service skipped", svc.Name, strings.Join(msgs, "; "))
		return false
	}
	if len(svc.Spec.Ports) == 0 {
		p.add("has no ports")
		return false
	}
	switch svc.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		p.add("unknown type %q, treated as ClusterIP", svc.Spec.Type)
	}
	return true
}

// portTemplate is what every port of the Service shares: its addresses,
// policies, affinity and load balancer settings. With dropExternalIPs the
// external IPs are left out, as if the Service had none, and returned as
// ignored.
func portTemplate(svc *corev1.Service, clusterIPs []netip.Addr, dropExternalIPs bool, p *problems) (tmpl model.ServicePort, ignored []netip.Addr) {
	// An address listed under two roles would become two map elements with
	// one key, which the kernel refuses: the cluster IP keeps it, then the
	// external IP.
	externalIPs := parseIPList(svc.Spec.ExternalIPs, "spec.externalIPs", notForEndpoint, p)
	if dropExternalIPs {
		ignored, externalIPs = externalIPs, nil
	}
	externalIPs = withoutAddrs(externalIPs, clusterIPs, "spec.externalIPs", "cluster IP", p)
	lbIPs := loadBalancerIPs(svc, p)
	lbIPs = withoutAddrs(lbIPs, clusterIPs, lbIngressField, "cluster IP", p)
	lbIPs = withoutAddrs(lbIPs, externalIPs, lbIngressField, "external IP", p)

	tmpl = model.ServicePort{
		ClusterIPs:          clusterIPs,
		ExternalIPs:         externalIPs,
		LoadBalancerIPs:     lbIPs,
		AffinityTimeout:     affinityTimeout(svc, p),
		InternalPolicyLocal: internalPolicyLocal(svc, p),
	}
	if svc.Spec.TrafficDistribution != nil {
		tmpl.TrafficDistribution = *svc.Spec.TrafficDistribution
	}
	tmpl.ExternalPolicyLocal = externalPolicyLocal(svc, len(tmpl.ExternalIPs) > 0, p)
	if tmpl.ExternalPolicyLocal && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		// Only LoadBalancer Services with eTP Local get a health check port.
		if hc, ok := port16(svc.Spec.HealthCheckNodePort); ok {
			tmpl.HealthCheckNodePort = hc
		} else if svc.Spec.HealthCheckNodePort != 0 {
			p.add("healthCheckNodePort %d out of range 1-65535, ignored", svc.Spec.HealthCheckNodePort)
		}
	}
	ranges, rangesGiven := sourceRanges(svc, p)
	tmpl.LoadBalancerSourceRanges = ranges
	if rangesGiven && len(ranges) == 0 && len(tmpl.LoadBalancerIPs) > 0 {
		// Dropping every range would open the load balancer to the world;
		// fail closed instead.
		p.add("no valid load balancer source range: load balancer IPs not programmed")
		tmpl.LoadBalancerIPs = nil
	}
	return tmpl, ignored
}

type protoPort struct {
	proto model.Protocol
	port  uint16
}

// portsSeen is what the ports of one Service checked so far took: names,
// protocol and port pairs, and node ports (with the label of the port
// using each).
type portsSeen struct {
	names     map[string]bool
	ports     map[protoPort]bool
	nodePorts map[protoPort]string
}

func newPortsSeen() *portsSeen {
	return &portsSeen{names: map[string]bool{}, ports: map[protoPort]bool{}, nodePorts: map[protoPort]string{}}
}

// check converts one spec.ports entry. ok is false when the port is
// skipped (the problem is noted); a node port another port of the Service
// uses already is dropped alone.
func (s *portsSeen) check(svc *corev1.Service, sp *corev1.ServicePort, label string, p *problems) (proto model.Protocol, port, nodePort uint16, ok bool) {
	if sp.Name != "" {
		// The API server checks a Service port's name as a DNS-1123
		// label (up to 63 characters), not as a container port's
		// IANA service name (up to 15).
		if msgs := validation.IsDNS1123Label(sp.Name); len(msgs) > 0 {
			p.add("%s: invalid name: %s, port skipped", label, strings.Join(msgs, "; "))
			return "", 0, 0, false
		}
	}
	proto, err := model.ParseProtocol(string(sp.Protocol))
	if err != nil {
		p.add("%s: %v, port skipped", label, err)
		return "", 0, 0, false
	}
	if port, ok = port16(sp.Port); !ok {
		p.add("%s: port %d out of range 1-65535, port skipped", label, sp.Port)
		return "", 0, 0, false
	}
	if s.names[sp.Name] {
		p.add("%s: duplicate port name, port skipped", label)
		return "", 0, 0, false
	}
	if s.ports[protoPort{proto, port}] {
		p.add("%s: duplicate %s port %d, port skipped", label, proto, port)
		return "", 0, 0, false
	}
	if nodePort, ok = servicePortNodePort(svc, sp, label, p); !ok {
		return "", 0, 0, false
	}
	if nodePort != 0 {
		if other, dup := s.nodePorts[protoPort{proto, nodePort}]; dup {
			p.add("%s: nodePort %d/%s is already used by %s, ignored", label, nodePort, proto, other)
			nodePort = 0
		} else {
			s.nodePorts[protoPort{proto, nodePort}] = label
		}
	}
	s.names[sp.Name] = true
	s.ports[protoPort{proto, port}] = true
	return proto, port, nodePort, true
}

func ignoredService(svc *corev1.Service) bool {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return true
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true
	}
	if _, ok := svc.Labels[LabelHeadless]; ok {
		return true
	}
	primary := svc.Spec.ClusterIP
	if primary == "" && len(svc.Spec.ClusterIPs) > 0 {
		primary = svc.Spec.ClusterIPs[0]
	}
	return primary == corev1.ClusterIPNone
}

func portLabel(name string, i int) string {
	if name == "" {
		return "port #" + strconv.Itoa(i)
	}
	return "port " + strconv.Quote(name)
}

// serviceClusterIPs returns the cluster IPs, at most one per family, primary
// first. A bad primary IP makes the Service unusable; a bad secondary is dropped.
func serviceClusterIPs(svc *corev1.Service, p *problems) ([]netip.Addr, bool) {
	raw := svc.Spec.ClusterIPs
	if len(raw) == 0 && svc.Spec.ClusterIP != "" {
		raw = []string{svc.Spec.ClusterIP}
	}
	if len(raw) == 0 {
		p.add("spec.clusterIP is empty")
		return nil, false
	}
	if svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != raw[0] {
		p.add("spec.clusterIP %q differs from spec.clusterIPs[0] %q, using spec.clusterIPs", svc.Spec.ClusterIP, raw[0])
	}
	primary, err := parseIP(raw[0])
	if err == nil {
		err = refuse(primary, notForTraffic)
	}
	if err != nil {
		p.add("spec.clusterIPs[0]: %v, service skipped", err)
		return nil, false
	}
	ips := []netip.Addr{primary}
	for i, s := range raw[1:] {
		ip, err := parseIP(s)
		if err == nil {
			err = refuse(ip, notForTraffic)
		}
		switch {
		case err != nil:
			p.add("spec.clusterIPs[%d]: %v, dropped", i+1, err)
		case slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Is4() == ip.Is4() }):
			p.add("spec.clusterIPs[%d]: second address of the same family %q, dropped", i+1, s)
		default:
			ips = append(ips, ip)
		}
	}
	return ips, true
}

// refuse turns what check says against an address into an error.
func refuse(a netip.Addr, check func(netip.Addr) string) error {
	if why := check(a); why != "" {
		return fmt.Errorf("%s is %s", a, why)
	}
	return nil
}

// parseIPList parses addresses, dropping (and reporting) bad ones and the
// ones check refuses, and silently dropping repeats.
func parseIPList(raw []string, field string, check func(netip.Addr) string, p *problems) []netip.Addr {
	var ips []netip.Addr
	for i, s := range raw {
		ip, err := parseIP(strings.TrimSpace(s))
		if err == nil {
			err = refuse(ip, check)
		}
		if err != nil {
			p.add("%s[%d]: %v, dropped", field, i, err)
			continue
		}
		if !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	return ips
}

// withoutAddrs drops from ips, and reports, every address that is also in
// used, the Service's addresses of the given role. ips comes back unchanged
// when nothing is dropped.
func withoutAddrs(ips, used []netip.Addr, field, role string, p *problems) []netip.Addr {
	if !slices.ContainsFunc(ips, func(a netip.Addr) bool { return slices.Contains(used, a) }) {
		return ips
	}
	var out []netip.Addr
	for _, ip := range ips {
		if slices.Contains(used, ip) {
			p.add("%s: %s is also the Service's %s, dropped", field, ip, role)
			continue
		}
		out = append(out, ip)
	}
	return out
}

const lbIngressField = "status.loadBalancer.ingress ip"

// loadBalancerIPs takes the ingress IPs traffic arrives at unchanged (VIP
// mode, the default). Proxy-mode load balancers rewrite the destination to a
// node or pod, so the proxy has nothing to do for their IPs.
func loadBalancerIPs(svc *corev1.Service, p *problems) []netip.Addr {
	var raw []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress
		}
		if ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			continue
		}
		raw = append(raw, ing.IP)
	}
	return parseIPList(raw, lbIngressField, notForTraffic, p)
}

// sourceRanges reads spec.loadBalancerSourceRanges, or else the older
// annotation. given reports whether any range was asked for, so the caller
// can tell "no restriction" from "every range was invalid".
func sourceRanges(svc *corev1.Service, p *problems) (ranges []netip.Prefix, given bool) {
	raw, field := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(raw) == 0 {
		if a, ok := svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]; ok {
			raw, field = strings.Split(a, ","), "annotation "+corev1.AnnotationLoadBalancerSourceRangesKey
		}
	}
	for i, s := range raw {
		s = strings.TrimSpace(s) // the API has always tolerated padding here
		if s == "" {
			continue
		}
		given = true
		pfx, err := parsePrefix(s)
		if err != nil {
			p.add("%s[%d]: %v, dropped", field, i, err)
			continue
		}
		if !slices.Contains(ranges, pfx) {
			ranges = append(ranges, pfx)
		}
	}
	return ranges, given
}

func affinityTimeout(svc *corev1.Service, p *problems) time.Duration {
	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		return 0
	case corev1.ServiceAffinityClientIP:
	default:
		p.add("unknown sessionAffinity %q, treated as None", svc.Spec.SessionAffinity)
		return 0
	}
	cfg := svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return defaultAffinityTimeout
	}
	secs := *cfg.ClientIP.TimeoutSeconds
	if secs <= 0 {
		p.add("sessionAffinityConfig.clientIP.timeoutSeconds %d is not positive, using %v", secs, defaultAffinityTimeout)
		return defaultAffinityTimeout
	}
	return time.Duration(secs) * time.Second
}

// externalPolicyLocal is eTP Local on a Service that can be reached from
// outside at all; on a purely internal Service the field means nothing.
func externalPolicyLocal(svc *corev1.Service, hasExternalIPs bool, p *problems) bool {
	switch svc.Spec.ExternalTrafficPolicy {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
		return false
	case corev1.ServiceExternalTrafficPolicyLocal:
	default:
		p.add("unknown externalTrafficPolicy %q, treated as Cluster", svc.Spec.ExternalTrafficPolicy)
		return false
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		return true
	}
	return hasExternalIPs
}

func internalPolicyLocal(svc *corev1.Service, p *problems) bool {
	if svc.Spec.InternalTrafficPolicy == nil {
		return false
	}
	switch *svc.Spec.InternalTrafficPolicy {
	case "", corev1.ServiceInternalTrafficPolicyCluster:
		return false
	case corev1.ServiceInternalTrafficPolicyLocal:
		return true
	}
	p.add("unknown internalTrafficPolicy %q, treated as Cluster", *svc.Spec.InternalTrafficPolicy)
	return false
}

// servicePortNodePort validates spec.ports[].nodePort. ok=false skips the
// port: a NodePort Service with a garbage node port must not be half-programmed.
func servicePortNodePort(svc *corev1.Service, sp *corev1.ServicePort, label string, p *problems) (uint16, bool) {
	if sp.NodePort == 0 {
		return 0, true
	}
	np, ok := port16(sp.NodePort)
	if !ok {
		p.add("%s: nodePort %d out of range 1-65535, port skipped", label, sp.NodePort)
		return 0, false
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		return np, true
	}
	p.add("%s: nodePort %d on a Service of type %q, ignored", label, sp.NodePort, serviceType(svc))
	return 0, true
}

func serviceType(svc *corev1.Service) corev1.ServiceType {
	if svc.Spec.Type == "" {
		return corev1.ServiceTypeClusterIP
	}
	return svc.Spec.Type
}
