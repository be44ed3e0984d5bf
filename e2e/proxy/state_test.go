package proxy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// YAML for the proxy's state directory, written as text.

// service is a single-stack IPv4 Service with one port.
type service struct {
	namespace, name string
	clusterIP       netip.Addr
	portName        string
	protocol        string // TCP or UDP
	port            int
	targetPort      int
}

func (s service) yaml() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  type: ClusterIP
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv4]
  clusterIP: %[3]s
  clusterIPs: [%[3]s]
  ports:
  - name: %[4]s
    protocol: %[5]s
    port: %[6]d
    targetPort: %[7]d
`, s.name, s.namespace, s.clusterIP, s.portName, s.protocol, s.port, s.targetPort)
}

// endpointSlice is an EndpointSlice of one Service port whose endpoints are
// pods on the node, ready.
type endpointSlice struct {
	namespace, name, service string
	ipv6                     bool
	portName                 string
	protocol                 string
	port                     int
	pods                     []sandbox.Pod
}

func (s endpointSlice) yaml() string {
	var b strings.Builder
	family := "IPv4"
	if s.ipv6 {
		family = "IPv6"
	}
	fmt.Fprintf(&b, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s
  namespace: %s
  labels:
    kubernetes.io/service-name: %s
addressType: %s
ports:
- name: %s
  protocol: %s
  port: %d
`, s.name, s.namespace, s.service, family, s.portName, s.protocol, s.port)
	if len(s.pods) == 0 {
		b.WriteString("endpoints: []\n")
		return b.String()
	}
	b.WriteString("endpoints:\n")
	for _, p := range s.pods {
		addr := p.IPv4
		if s.ipv6 {
			addr = p.IPv6
		}
		fmt.Fprintf(&b, `- addresses: [%q]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: %s
  targetRef: {kind: Pod, namespace: %s, name: %s}
`, addr, nodeName, s.namespace, p.Name)
	}
	return b.String()
}

// documents joins YAML documents into one file.
func documents(docs ...string) string { return strings.Join(docs, "---\n") }

// exampleSlices is the example's endpointslices.yaml with the given pods as
// the endpoints of both Services (web on IPv4 and IPv6, dns-like).
func exampleSlices(pods ...sandbox.Pod) string {
	return documents(
		endpointSlice{namespace: "default", name: "web-ipv4", service: "web", portName: "http", protocol: "TCP", port: podTCPPort, pods: pods}.yaml(),
		endpointSlice{namespace: "default", name: "web-ipv6", service: "web", ipv6: true, portName: "http", protocol: "TCP", port: podTCPPort, pods: pods}.yaml(),
		endpointSlice{namespace: "default", name: "dns-like-ipv4", service: "dns-like", portName: "dns", protocol: "UDP", port: podUDPPort, pods: pods}.yaml(),
	)
}

// Many Services for the scale tests: namespace "load", svc-0 ... svc-N-1,
// TCP port 80, ClusterIPs from 10.96.16.0 on (up to 10.96.255.255: 61,440
// of them), each with pod-a and pod-b as endpoints on a port nothing
// listens on.
const (
	loadNamespace = "load"
	loadPortBase  = 9000
)

func loadClusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(16 + i/256), byte(i % 256)})
}

func loadServices(n int) string {
	docs := make([]string, n)
	for i := range n {
		docs[i] = service{
			namespace: loadNamespace, name: fmt.Sprintf("svc-%d", i), clusterIP: loadClusterIP(i),
			portName: "http", protocol: "TCP", port: 80, targetPort: loadPortBase,
		}.yaml()
	}
	return documents(docs...)
}

// loadSlices gives the n Services their endpoints pod-a and pod-b on port.
func loadSlices(n, port int) string {
	return loadSlicesPorts(n, func(int) int { return port })
}

// loadSlicesPorts is loadSlices with Service i's endpoints on port(i).
func loadSlicesPorts(n int, port func(i int) int) string {
	docs := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		docs[i] = endpointSlice{
			namespace: loadNamespace, name: name + "-ipv4", service: name,
			portName: "http", protocol: "TCP", port: port(i), pods: []sandbox.Pod{podA, podB},
		}.yaml()
	}
	return documents(docs...)
}
