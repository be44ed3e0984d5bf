package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// sp builds an expected ServicePort of default/<svc>.
func sp(svc, port string, proto model.Protocol, num uint16, clusterIPs ...string) *model.ServicePort {
	return &model.ServicePort{
		Name:       model.ServicePortName{Namespace: "default", Name: svc, Port: port},
		Protocol:   proto,
		Port:       num,
		ClusterIPs: sourcetest.Addrs(clusterIPs...),
	}
}

func with(p *model.ServicePort, f func(*model.ServicePort)) *model.ServicePort {
	f(p)
	return p
}

func TestServicePorts(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		want     []*model.ServicePort
		wantErrs []string // one substring per expected problem
	}{{
		name: "ClusterIP, protocol defaults to TCP, clusterIP fallback",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]`,
		want: []*model.ServicePort{sp("web", "http", model.TCP, 80, "10.96.0.10")},
	}, {
		name: "namespace defaults to default, unnamed port",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIPs: [10.96.0.10]
  ports: [{port: 80}]`,
		want: []*model.ServicePort{sp("web", "", model.TCP, 80, "10.96.0.10")},
	}, {
		name: "NodePort with several protocols",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.53
  ports:
  - {name: dns, protocol: UDP, port: 53, nodePort: 30053}
  - {name: dns-tcp, protocol: TCP, port: 53, nodePort: 30054}
  - {name: sctp, protocol: SCTP, port: 9999, nodePort: 30055}`,
		want: []*model.ServicePort{
			with(sp("dns", "dns", model.UDP, 53, "10.96.0.53"), func(p *model.ServicePort) { p.NodePort = 30053 }),
			with(sp("dns", "dns-tcp", model.TCP, 53, "10.96.0.53"), func(p *model.ServicePort) { p.NodePort = 30054 }),
			with(sp("dns", "sctp", model.SCTP, 9999, "10.96.0.53"), func(p *model.ServicePort) { p.NodePort = 30055 }),
		},
	}, {
		name: "LoadBalancer: VIP and unset ipMode kept, Proxy and hostname-only left out, eTP Local with health check",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [" 192.0.2.0/24", "2001:db8::/32", 198.51.100.7/24]
  ports: [{name: https, port: 443, nodePort: 30443}]
status:
  loadBalancer:
    ingress:
    - ip: 203.0.113.1
    - ip: 203.0.113.2
      ipMode: VIP
    - ip: 203.0.113.3
      ipMode: Proxy
    - hostname: lb.example.com
    - ip: "2001:db8::1"`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.NodePort = 30443
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1", "203.0.113.2", "2001:db8::1")
			p.LoadBalancerSourceRanges = sourcetest.Prefixes("192.0.2.0/24", "2001:db8::/32", "198.51.100.0/24")
			p.ExternalPolicyLocal = true
			p.HealthCheckNodePort = 32000
		})},
	}, {
		name: "source ranges from the annotation, bare IPs are single hosts",
		yaml: `
apiVersion: v1
kind: Service
metadata:
  name: lb
  namespace: default
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: "192.0.2.0/24, 198.51.100.7,2001:db8::5,"
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 443, nodePort: 30443}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.NodePort = 30443
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1")
			p.LoadBalancerSourceRanges = sourcetest.Prefixes("192.0.2.0/24", "198.51.100.7/32", "2001:db8::5/128")
		})},
	}, {
		name: "spec source ranges win over the annotation",
		yaml: `
apiVersion: v1
kind: Service
metadata:
  name: lb
  namespace: default
  annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: "10.0.0.0/8"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  loadBalancerSourceRanges: [192.0.2.0/24]
  ports: [{name: https, port: 443}]`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.LoadBalancerSourceRanges = sourcetest.Prefixes("192.0.2.0/24")
		})},
	}, {
		name: "externalIPs make eTP Local count on a ClusterIP Service",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
  clusterIP: 10.96.0.30
  externalIPs: [192.0.2.10, "2001:db8::10", 192.0.2.10]
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{with(sp("ext", "http", model.TCP, 80, "10.96.0.30"), func(p *model.ServicePort) {
			p.ExternalIPs = sourcetest.Addrs("192.0.2.10", "2001:db8::10")
			p.ExternalPolicyLocal = true
		})},
	}, {
		name: "eTP Local means nothing on an internal-only Service; iTP Local does",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: internal, namespace: default}
spec:
  clusterIP: 10.96.0.31
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  trafficDistribution: PreferClose
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{with(sp("internal", "http", model.TCP, 80, "10.96.0.31"), func(p *model.ServicePort) {
			p.InternalPolicyLocal = true
			p.TrafficDistribution = "PreferClose"
		})},
	}, {
		name: "eTP Local on NodePort; no health check port outside LoadBalancer",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.32
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80, nodePort: 30080}]`,
		want: []*model.ServicePort{with(sp("np", "http", model.TCP, 80, "10.96.0.32"), func(p *model.ServicePort) {
			p.NodePort = 30080
			p.ExternalPolicyLocal = true
		})},
	}, {
		name: "ClientIP affinity defaults to 10800 s",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.40
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{with(sp("sticky", "http", model.TCP, 80, "10.96.0.40"), func(p *model.ServicePort) {
			p.AffinityTimeout = 10800 * time.Second
		})},
	}, {
		name: "ClientIP affinity with a timeout",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.40
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{with(sp("sticky", "http", model.TCP, 80, "10.96.0.40"), func(p *model.ServicePort) {
			p.AffinityTimeout = time.Minute
		})},
	}, {
		name: "affinity None ignores its config",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.40
  sessionAffinity: None
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("sticky", "http", model.TCP, 80, "10.96.0.40")},
	}, {
		name: "dual-stack, IPv6 primary",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: ds, namespace: default}
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIP: "fd00:10:96::10"
  clusterIPs: ["fd00:10:96::10", 10.96.0.10]
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("ds", "http", model.TCP, 80, "fd00:10:96::10", "10.96.0.10")},
	}, {
		name: "legacy IPv4 with leading zeros reads as decimal",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: old, namespace: default}
spec:
  clusterIP: 010.096.000.011
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("old", "http", model.TCP, 80, "10.96.0.11")},
	}, {
		name: "ExternalName is ignored",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
  type: ExternalName
  externalName: example.com
  ports: [{name: http, port: 80}]`,
	}, {
		name: "headless is ignored",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: default}
spec:
  clusterIP: None
  clusterIPs: [None]
  ports: [{name: http, port: 80}]`,
	}, {
		name: "another proxy's Service is ignored",
		yaml: `
apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: default
  labels: {service.kubernetes.io/service-proxy-name: someone-else}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 80}]`,
	}, {
		// Bad input from here on.
		name: "bad clusterIP skips the Service",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  clusterIP: 10.96.0.300
  ports: [{name: http, port: 80}]`,
		wantErrs: []string{`service default/bad: spec.clusterIPs[0]: invalid IP address "10.96.0.300", service skipped`},
	}, {
		name: "a loopback clusterIP skips the Service",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  clusterIP: 127.0.0.1
  ports: [{name: http, port: 80}]`,
		wantErrs: []string{`service default/bad: spec.clusterIPs[0]: 127.0.0.1 is a loopback address, service skipped`},
	}, {
		name: "a multicast clusterIP skips the Service; a special secondary is dropped",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  clusterIPs: [224.0.0.251]
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: ds, namespace: default}
spec:
  clusterIPs: [10.96.0.10, "ff02::1"]
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("ds", "http", model.TCP, 80, "10.96.0.10")},
		wantErrs: []string{
			`service default/bad: spec.clusterIPs[0]: 224.0.0.251 is a multicast address, service skipped`,
			`service default/ds: spec.clusterIPs[1]: ff02::1 is a multicast address, dropped`,
		},
	}, {
		name: "external and load balancer IPs traffic cannot be sent to are dropped",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalIPs: [192.0.2.10, 127.0.0.1, 169.254.169.254, 239.1.1.1, 255.255.255.255]
  ports: [{name: https, port: 443}]
status:
  loadBalancer: {ingress: [{ip: 127.0.0.53}, {ip: 224.0.0.1}, {ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.ExternalIPs = sourcetest.Addrs("192.0.2.10")
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1")
		})},
		wantErrs: []string{
			`service default/lb: spec.externalIPs[1]: 127.0.0.1 is a loopback address, dropped`,
			`service default/lb: spec.externalIPs[2]: 169.254.169.254 is a link-local address, dropped`,
			`service default/lb: spec.externalIPs[3]: 239.1.1.1 is a multicast address, dropped`,
			`service default/lb: spec.externalIPs[4]: 255.255.255.255 is the broadcast address, dropped`,
			`service default/lb: status.loadBalancer.ingress ip[0]: 127.0.0.53 is a loopback address, dropped`,
			`service default/lb: status.loadBalancer.ingress ip[1]: 224.0.0.1 is a multicast address, dropped`,
		},
	}, {
		name: "missing clusterIP skips the Service",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  ports: [{name: http, port: 80}]`,
		wantErrs: []string{`service default/bad: spec.clusterIP is empty`},
	}, {
		name: "bad secondary clusterIP and a second one of the same family are dropped",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: ds, namespace: default}
spec:
  clusterIPs: [10.96.0.10, 10.96.0.11, "fd00::zz", "fd00:10:96::10"]
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("ds", "http", model.TCP, 80, "10.96.0.10", "fd00:10:96::10")},
		wantErrs: []string{
			`service default/ds: spec.clusterIPs[1]: second address of the same family "10.96.0.11", dropped`,
			`service default/ds: spec.clusterIPs[2]: invalid IP address "fd00::zz", dropped`,
		},
	}, {
		name: "one bad externalIP is dropped, the rest stays",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [192.0.2.10, not-an-ip, 0.0.0.0]
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{with(sp("web", "http", model.TCP, 80, "10.96.0.10"), func(p *model.ServicePort) {
			p.ExternalIPs = sourcetest.Addrs("192.0.2.10")
		})},
		wantErrs: []string{
			`service default/web: spec.externalIPs[1]: invalid IP address "not-an-ip", dropped`,
			`service default/web: spec.externalIPs[2]: invalid IP address "0.0.0.0": unspecified address, dropped`,
		},
	}, {
		name: "bad load balancer ingress IP is dropped",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 443}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.999}, {ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1")
		})},
		wantErrs: []string{`service default/lb: status.loadBalancer.ingress ip[0]: invalid IP address "203.0.113.999", dropped`},
	}, {
		name: "a bad source range is dropped",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  loadBalancerSourceRanges: [192.0.2.0/33, 198.51.100.0/24]
  ports: [{name: https, port: 443}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20"), func(p *model.ServicePort) {
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1")
			p.LoadBalancerSourceRanges = sourcetest.Prefixes("198.51.100.0/24")
		})},
		wantErrs: []string{`service default/lb: spec.loadBalancerSourceRanges[0]: invalid CIDR "192.0.2.0/33", dropped`},
	}, {
		name: "only bad source ranges: fail closed, no load balancer IPs",
		yaml: `
apiVersion: v1
kind: Service
metadata:
  name: lb
  namespace: default
  annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: "bogus"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 443}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{sp("lb", "https", model.TCP, 443, "10.96.0.20")},
		wantErrs: []string{
			`service default/lb: annotation service.beta.kubernetes.io/load-balancer-source-ranges[0]: invalid CIDR "bogus", dropped`,
			`service default/lb: no valid load balancer source range: load balancer IPs not programmed`,
		},
	}, {
		name: "port 0, out of range, unknown protocol and duplicate name skip only those ports",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: zero, port: 0}
  - {name: big, port: 70000}
  - {name: icmp, protocol: ICMP, port: 7}
  - {name: http, port: 80}
  - {name: http, port: 81}
  - {name: http-again, port: 80}
  - {port: 8080}`,
		want: []*model.ServicePort{
			sp("web", "http", model.TCP, 80, "10.96.0.10"),
			sp("web", "", model.TCP, 8080, "10.96.0.10"),
		},
		wantErrs: []string{
			`service default/web: port "zero": port 0 out of range 1-65535, port skipped`,
			`service default/web: port "big": port 70000 out of range 1-65535, port skipped`,
			`service default/web: port "icmp": unknown protocol "ICMP" (want TCP, UDP or SCTP), port skipped`,
			`service default/web: port "http": duplicate port name, port skipped`,
			`service default/web: port "http-again": duplicate TCP port 80, port skipped`,
		},
	}, {
		// The API server accepts any DNS-1123 label as a Service port's
		// name: 16 to 63 characters, or digits only.
		name: "port names are DNS-1123 labels, not IANA service names",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: port-name-longer-than-fifteen, port: 80}
  - {name: abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefg, port: 81}
  - {name: "8443", port: 8443}
  - {name: abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi, port: 82}
  - {name: Upper, port: 83}`,
		want: []*model.ServicePort{
			sp("web", "port-name-longer-than-fifteen", model.TCP, 80, "10.96.0.10"),
			sp("web", "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefg", model.TCP, 81, "10.96.0.10"),
			sp("web", "8443", model.TCP, 8443, "10.96.0.10"),
		},
		wantErrs: []string{
			`service default/web: port "abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi": invalid name: must be no more than 63 characters, port skipped`,
			`service default/web: port "Upper": invalid name: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?'), port skipped`,
		},
	}, {
		name: "bad nodePort skips the port; nodePort on ClusterIP is ignored",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.32
  ports:
  - {name: a, port: 80, nodePort: 70000}
  - {name: b, port: 81, nodePort: 30081}
---
apiVersion: v1
kind: Service
metadata: {name: cip, namespace: default}
spec:
  clusterIP: 10.96.0.33
  ports: [{name: a, port: 80, nodePort: 30080}]`,
		want: []*model.ServicePort{
			with(sp("np", "b", model.TCP, 81, "10.96.0.32"), func(p *model.ServicePort) { p.NodePort = 30081 }),
			sp("cip", "a", model.TCP, 80, "10.96.0.33"),
		},
		wantErrs: []string{
			`service default/np: port "a": nodePort 70000 out of range 1-65535, port skipped`,
			`service default/cip: port "a": nodePort 30080 on a Service of type "ClusterIP", ignored`,
		},
	}, {
		name: "no ports",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.10`,
		wantErrs: []string{`service default/empty: has no ports`},
	}, {
		name: "only bad ports",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 0}]`,
		wantErrs: []string{
			`service default/web: port #0: port 0 out of range`,
			`service default/web: no valid ports, service skipped`,
		},
	}, {
		name: "unknown policy and affinity values fall back to the defaults",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: odd, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Sometimes
  internalTrafficPolicy: Nearby
  sessionAffinity: Cookie
  ports: [{name: http, port: 80}]`,
		want: []*model.ServicePort{sp("odd", "http", model.TCP, 80, "10.96.0.10")},
		wantErrs: []string{
			`service default/odd: unknown sessionAffinity "Cookie", treated as None`,
			`service default/odd: unknown externalTrafficPolicy "Sometimes", treated as Cluster`,
			`service default/odd: unknown internalTrafficPolicy "Nearby", treated as Cluster`,
		},
	}, {
		name: "an address under two roles is kept once: cluster IP, then external IP, then load balancer IP",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.20, "fd00::20"]
  externalIPs: [192.0.2.1, 10.96.0.20, "fd00::20"]
  ports: [{name: https, port: 443}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.1}, {ip: 10.96.0.20}, {ip: 203.0.113.1}]}`,
		want: []*model.ServicePort{with(sp("lb", "https", model.TCP, 443, "10.96.0.20", "fd00::20"), func(p *model.ServicePort) {
			p.ExternalIPs = sourcetest.Addrs("192.0.2.1")
			p.LoadBalancerIPs = sourcetest.Addrs("203.0.113.1")
		})},
		wantErrs: []string{
			`service default/lb: spec.externalIPs: 10.96.0.20 is also the Service's cluster IP, dropped`,
			`service default/lb: spec.externalIPs: fd00::20 is also the Service's cluster IP, dropped`,
			`service default/lb: status.loadBalancer.ingress ip: 10.96.0.20 is also the Service's cluster IP, dropped`,
			`service default/lb: status.loadBalancer.ingress ip: 192.0.2.1 is also the Service's external IP, dropped`,
		},
	}, {
		name: "two ports with one nodePort and protocol: the later port goes without; other protocols may share it",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.30
  ports:
  - {name: a, port: 80, nodePort: 30080}
  - {name: b, port: 81, nodePort: 30080}
  - {name: c, protocol: UDP, port: 80, nodePort: 30080}`,
		want: []*model.ServicePort{
			with(sp("np", "a", model.TCP, 80, "10.96.0.30"), func(p *model.ServicePort) { p.NodePort = 30080 }),
			sp("np", "b", model.TCP, 81, "10.96.0.30"),
			with(sp("np", "c", model.UDP, 80, "10.96.0.30"), func(p *model.ServicePort) { p.NodePort = 30080 }),
		},
		wantErrs: []string{`service default/np: port "b": nodePort 30080/TCP is already used by port "a", ignored`},
	}, {
		name: "unknown type is treated as ClusterIP",
		yaml: `
apiVersion: v1
kind: Service
metadata: {name: odd, namespace: default}
spec:
  type: Magic
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30080}]`,
		want: []*model.ServicePort{sp("odd", "http", model.TCP, 80, "10.96.0.10")},
		wantErrs: []string{
			`service default/odd: unknown type "Magic", treated as ClusterIP`,
			`service default/odd: port "http": nodePort 30080 on a Service of type "Magic", ignored`,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []*model.ServicePort
			var errs []error
			for _, o := range sourcetest.Decode(t, tt.yaml) {
				ports, err := ServicePorts(o.(*corev1.Service))
				got = append(got, ports...)
				errs = append(errs, SplitErrors(err)...)
			}
			sourcetest.MustEqual(t, "ports", got, tt.want)
			sourcetest.CheckErrors(t, errs, tt.wantErrs...)
		})
	}
}

func TestServicePortsNil(t *testing.T) {
	if ports, err := ServicePorts(nil); ports != nil || err != nil {
		t.Errorf("ServicePorts(nil) = %v, %v; want nil, nil", ports, err)
	}
}
