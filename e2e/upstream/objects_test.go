package upstream

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	localNode  = "node-1"
	remoteNode = "node-2"
)

// ep is one endpoint of a test Service: its address and node.
type ep struct {
	ip   string
	node string
	// notReady marks an endpoint that is not ready (and not serving).
	notReady bool
}

// svcSpec is one Service of the test and its endpoints.
type svcSpec struct {
	name string
	svc  corev1.ServiceSpec
	// lbIngress is the load balancer IP set in status.
	lbIngress string
	eps       []ep
}

func port(name string, proto corev1.Protocol, p, target int32, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: p, TargetPort: intstr.FromInt32(target), NodePort: nodePort}
}

func v4(ip string) ([]string, []corev1.IPFamily) {
	return []string{ip}, []corev1.IPFamily{corev1.IPv4Protocol}
}

// featureServices is a feature-rich set: every kind of Service address,
// traffic policy, affinity, source ranges, no endpoints, several ports.
func featureServices() []svcSpec {
	mk := func(name, typ, ip string, ports ...corev1.ServicePort) corev1.ServiceSpec {
		ips, fams := v4(ip)
		return corev1.ServiceSpec{Type: corev1.ServiceType(typ), ClusterIP: ip, ClusterIPs: ips, IPFamilies: fams, Ports: ports}
	}
	tcp := corev1.ProtocolTCP
	udp := corev1.ProtocolUDP
	local := []ep{{ip: "10.244.0.10", node: localNode}, {ip: "10.244.0.11", node: localNode}}
	mixed := []ep{{ip: "10.244.0.10", node: localNode}, {ip: "10.244.1.20", node: remoteNode}, {ip: "10.244.1.21", node: remoteNode}}
	remote := []ep{{ip: "10.244.1.20", node: remoteNode}}

	web := mk("web", "ClusterIP", "10.96.20.1", port("http", tcp, 80, 8080, 0))
	np := mk("np", "NodePort", "10.96.20.2", port("http", tcp, 80, 8080, 30080))
	lb := mk("lb", "LoadBalancer", "10.96.20.3", port("https", tcp, 443, 8443, 30443))
	lb.LoadBalancerSourceRanges = []string{"10.99.0.0/24", "192.0.2.0/24"}
	lbEmpty := mk("lb-empty", "LoadBalancer", "10.96.20.4", port("https", tcp, 443, 8443, 30444))
	lbEmpty.LoadBalancerSourceRanges = []string{"10.99.0.0/24"}
	ext := mk("ext", "ClusterIP", "10.96.20.5", port("dns", udp, 53, 5353, 0), port("dns-tcp", tcp, 53, 5353, 0))
	ext.ExternalIPs = []string{"192.0.2.50"}
	extEmpty := mk("ext-empty", "ClusterIP", "10.96.20.6", port("http", tcp, 80, 8080, 0))
	extEmpty.ExternalIPs = []string{"192.0.2.51"}
	sticky := mk("sticky", "NodePort", "10.96.20.7", port("http", tcp, 80, 8080, 30081))
	sticky.SessionAffinity = corev1.ServiceAffinityClientIP
	sticky.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
	etpLocal := mk("etp-local", "LoadBalancer", "10.96.20.8", port("http", tcp, 80, 8080, 30082))
	etpLocal.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	etpLocal.HealthCheckNodePort = 32000
	etpNone := mk("etp-local-none", "NodePort", "10.96.20.9", port("http", tcp, 80, 8080, 30083))
	etpNone.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	itpLocal := mk("itp-local", "ClusterIP", "10.96.20.10", port("http", tcp, 80, 8080, 0))
	itpLocal.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	itpNone := mk("itp-local-none", "ClusterIP", "10.96.20.11", port("http", tcp, 80, 8080, 0))
	itpNone.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	empty := mk("empty", "NodePort", "10.96.20.12", port("http", tcp, 80, 8080, 30084))
	multi := mk("multi", "ClusterIP", "10.96.20.13", port("http", tcp, 80, 8080, 0), port("metrics", tcp, 9090, 9090, 0))
	dual := corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.20.14",
		ClusterIPs: []string{"10.96.20.14", "fd00:10:96::14"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		IPFamilyPolicy: ptr(corev1.IPFamilyPolicyRequireDualStack), Ports: []corev1.ServicePort{port("http", tcp, 80, 8080, 0)}}
	return []svcSpec{
		{name: "web", svc: web, eps: local},
		{name: "np", svc: np, eps: mixed},
		{name: "lb", svc: lb, lbIngress: "203.0.113.10", eps: local},
		{name: "lb-empty", svc: lbEmpty, lbIngress: "203.0.113.11"},
		{name: "ext", svc: ext, eps: local},
		{name: "ext-empty", svc: extEmpty},
		{name: "sticky", svc: sticky, eps: local},
		{name: "etp-local", svc: etpLocal, lbIngress: "203.0.113.12", eps: mixed},
		{name: "etp-local-none", svc: etpNone, eps: remote},
		{name: "itp-local", svc: itpLocal, eps: mixed},
		{name: "itp-local-none", svc: itpNone, eps: remote},
		{name: "empty", svc: empty},
		{name: "multi", svc: multi, eps: append([]ep{{ip: "10.244.0.12", node: localNode, notReady: true}}, local...)},
		{name: "dual", svc: dual, eps: append(append([]ep(nil), local...), ep{ip: "fd00:10:244::10", node: localNode}, ep{ip: "fd00:10:244::11", node: localNode})},
	}
}

func (s svcSpec) object() *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: "default"},
		Spec:       s.svc,
	}
}

// slices are the Service's EndpointSlices, one per address family, with
// every Service port mapped to its target port.
func (s svcSpec) slices() []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		var eps []discoveryv1.Endpoint
		for _, e := range s.eps {
			if netip.MustParseAddr(e.ip).Is6() != (fam == discoveryv1.AddressTypeIPv6) {
				continue
			}
			ready := !e.notReady
			eps = append(eps, discoveryv1.Endpoint{
				Addresses:  []string{e.ip},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
				NodeName:   ptr(e.node),
			})
		}
		if len(eps) == 0 && fam == discoveryv1.AddressTypeIPv6 {
			continue
		}
		var ports []discoveryv1.EndpointPort
		for _, p := range s.svc.Ports {
			ports = append(ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: ptr(p.TargetPort.IntVal)})
		}
		out = append(out, &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s", s.name, map[discoveryv1.AddressType]string{"IPv4": "ipv4", "IPv6": "ipv6"}[fam]), Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: s.name, discoveryv1.LabelManagedBy: "kube-nftproxy-e2e"}},
			AddressType: fam,
			Ports:       ports,
			Endpoints:   eps,
		})
	}
	return out
}

func node(name, ip4, ip6, podCIDR4, podCIDR6 string) *corev1.Node {
	return &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR4, PodCIDRs: []string{podCIDR4, podCIDR6}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: ip4}, {Type: corev1.NodeInternalIP, Address: ip6},
		}},
	}
}

func ptr[T any](v T) *T { return &v }
