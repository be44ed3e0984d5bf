package kube

import (
	"net/netip"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// webPorts are the ports of Service default/web used by the endpoint tests.
func webPorts() []*model.ServicePort {
	return []*model.ServicePort{
		sp("web", "http", model.TCP, 80, "10.96.0.10", "fd00:10:96::10"),
		sp("web", "dns", model.UDP, 53, "10.96.0.10", "fd00:10:96::10"),
	}
}

const sliceHeader = `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: default
  labels: {kubernetes.io/service-name: web}
`

func TestEndpointsForService(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		want     map[model.ServicePortName][]model.Endpoint
		wantErrs []string
	}{{
		name: "conditions: nil ready and nil serving are true, nil terminating is false",
		yaml: sliceHeader + `  name: web-a
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- {addresses: [10.0.0.1], nodeName: node-1}
- {addresses: [10.0.0.2], nodeName: node-1, conditions: {ready: false}}
- {addresses: [10.0.0.3], nodeName: node-1, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.0.0.4], nodeName: node-1, conditions: {ready: true, serving: false, terminating: false}}
- addresses: [10.0.0.5]
  nodeName: node-2
  zone: zone-b
  hints: {forZones: [{name: zone-b}, {name: zone-a}]}
- addresses: [10.0.0.6]
  nodeName: node-1
  zone: zone-a
  hints: {forZones: [{name: zone-a}], forNodes: [{name: node-1}, {name: node-3}, {name: node-1}]}
- addresses: [10.0.0.7]
  nodeName: node-1
  hints: {forNodes: [{name: node-1}]}
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {
			sourcetest.ReadyEndpoint("10.0.0.1", 8080),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.2", 8080), func(e *model.Endpoint) { e.Ready = false }),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.3", 8080), func(e *model.Endpoint) { e.Ready, e.Terminating = false, true }),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.4", 8080), func(e *model.Endpoint) { e.Serving = false }),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.5", 8080), func(e *model.Endpoint) {
				e.NodeName, e.Zone, e.ZoneHints = "node-2", "zone-b", []string{"zone-a", "zone-b"}
			}),
			// hints.forNodes (PreferSameNode): a sorted set, as the zones.
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.6", 8080), func(e *model.Endpoint) {
				e.Zone, e.ZoneHints, e.NodeHints = "zone-a", []string{"zone-a"}, []string{"node-1", "node-3"}
			}),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.7", 8080), func(e *model.Endpoint) { e.NodeHints = []string{"node-1"} }),
		}},
	}, {
		name: "ports match by name and protocol; unnamed slice port matches no named port",
		yaml: sliceHeader + `  name: web-a
addressType: IPv4
ports:
- {name: http, protocol: TCP, port: 8080}
- {name: dns, protocol: UDP, port: 5353}
- {name: dns, protocol: TCP, port: 5354}
- {name: metrics, port: 9090}
- {port: 1}
- {name: all}
endpoints:
- {addresses: [10.0.0.1], nodeName: node-1}
`,
		want: map[model.ServicePortName][]model.Endpoint{
			sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080)},
			sourcetest.WebPortName("dns"):  {sourcetest.ReadyEndpoint("10.0.0.1", 5353)},
		},
	}, {
		name: "several slices merge; duplicates keep the local copy, else the first slice by name; sorted",
		yaml: sliceHeader + `  name: web-c
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.9], nodeName: node-1}
- {addresses: [10.0.0.1], nodeName: node-2, zone: from-c}
- {addresses: [10.0.0.2], nodeName: node-1, zone: from-c}
---` + sliceHeader + `  name: web-a
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.10], nodeName: node-1}
- {addresses: [10.0.0.1], nodeName: node-3, zone: from-a}
- {addresses: [10.0.0.2], nodeName: node-2, zone: from-a}
---` + sliceHeader + `  name: web-b
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.1], nodeName: node-2, zone: from-b}
- {addresses: [10.0.0.9], nodeName: node-1, conditions: {ready: false}}
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.1", 8080), func(e *model.Endpoint) { e.NodeName, e.Zone = "node-3", "from-a" }),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.2", 8080), func(e *model.Endpoint) { e.Zone = "from-c" }),
			sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.9", 8080), func(e *model.Endpoint) { e.Ready = false }),
			sourcetest.ReadyEndpoint("10.0.0.10", 8080),
		}},
	}, {
		name: "the same address on two ports of one slice stays twice",
		yaml: sliceHeader + `  name: web-a
addressType: IPv4
ports: [{name: http, port: 8081}, {name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-1}]
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080), sourcetest.ReadyEndpoint("10.0.0.1", 8081)}},
	}, {
		name: "dual-stack: one slice per family",
		yaml: sliceHeader + `  name: web-v6
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00::1"], nodeName: node-1}]
---` + sliceHeader + `  name: web-v4
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1, 10.0.0.99], nodeName: node-1}]
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080), sourcetest.ReadyEndpoint("fd00::1", 8080)}},
	}, {
		name: "FQDN and headless slices are ignored",
		yaml: sliceHeader + `  name: web-fqdn
addressType: FQDN
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [example.com]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-headless
  namespace: default
  labels: {kubernetes.io/service-name: web, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
`,
		want: map[model.ServicePortName][]model.Endpoint{},
	}, {
		name: "bad endpoints and ports are dropped, the rest stays",
		yaml: sliceHeader + `  name: web-bad
addressType: IPv4
ports:
- {name: http, port: 8080}
- {name: dns, protocol: UDP, port: 0}
- {name: dns, protocol: ICMP, port: 53}
endpoints:
- {addresses: [10.0.0.1], nodeName: node-1}
- {addresses: [10.0.0.300]}
- {addresses: ["fd00::1"], nodeName: node-1}
- {addresses: []}
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
		wantErrs: []string{
			`endpointslice default/web-bad: ports[1]: port 0 out of range 1-65535, port skipped`,
			`endpointslice default/web-bad: ports[2]: unknown protocol "ICMP"`,
			`endpointslice default/web-bad: endpoints[1]: invalid IP address "10.0.0.300", endpoint skipped`,
			`endpointslice default/web-bad: endpoints[2]: address fd00::1 does not match addressType IPv4, endpoint skipped`,
			`endpointslice default/web-bad: endpoints[3]: no addresses, endpoint skipped`,
		},
	}, {
		name: "endpoints at addresses traffic cannot be sent to are dropped",
		yaml: sliceHeader + `  name: web-special
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.1], nodeName: node-1}
- {addresses: [127.0.0.1]}
- {addresses: [169.254.169.254]}
- {addresses: [224.0.0.251]}
- {addresses: [239.1.2.3]}
- {addresses: [255.255.255.255]}
- {addresses: [0.0.0.0]}
- {addresses: ["::ffff:127.0.0.2"]}
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}},
		wantErrs: []string{
			`endpointslice default/web-special: endpoints[1]: address 127.0.0.1 is a loopback address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[2]: address 169.254.169.254 is a link-local address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[3]: address 224.0.0.251 is a multicast address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[4]: address 239.1.2.3 is a multicast address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[5]: address 255.255.255.255 is the broadcast address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[6]: invalid IP address "0.0.0.0": unspecified address, endpoint skipped`,
			`endpointslice default/web-special: endpoints[7]: address 127.0.0.2 is a loopback address, endpoint skipped`,
		},
	}, {
		name: "IPv6 endpoints at addresses traffic cannot be sent to are dropped",
		yaml: sliceHeader + `  name: web-special6
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00::1"], nodeName: node-1}
- {addresses: ["::1"]}
- {addresses: ["fe80::1"]}
- {addresses: ["ff02::fb"]}
- {addresses: ["ff05::2"]}
- {addresses: ["::"]}
`,
		want: map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("fd00::1", 8080)}},
		wantErrs: []string{
			`endpointslice default/web-special6: endpoints[1]: address ::1 is a loopback address, endpoint skipped`,
			`endpointslice default/web-special6: endpoints[2]: address fe80::1 is a link-local address, endpoint skipped`,
			`endpointslice default/web-special6: endpoints[3]: address ff02::fb is a multicast address, endpoint skipped`,
			`endpointslice default/web-special6: endpoints[4]: address ff05::2 is a multicast address, endpoint skipped`,
			`endpointslice default/web-special6: endpoints[5]: invalid IP address "::": unspecified address, endpoint skipped`,
		},
	}, {
		name: "slices without the service label, of another Service or with an unknown address type are skipped",
		yaml: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan, namespace: default}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-a, namespace: default, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
---` + sliceHeader + `  name: web-x
addressType: IPv5
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
`,
		want: map[model.ServicePortName][]model.Endpoint{},
		wantErrs: []string{
			`endpointslice default/orphan: no kubernetes.io/service-name label, slice skipped`,
			`endpointslice default/other-a: belongs to service default/other, not default/web; skipped`,
			`endpointslice default/web-x: unknown addressType "IPv5", slice skipped`,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EndpointsForService(webPorts(), sourcetest.DecodeSlices(t, tt.yaml), "node-1")
			sourcetest.MustEqual(t, "endpoints", got, tt.want)
			sourcetest.CheckErrors(t, SplitErrors(err), tt.wantErrs...)
		})
	}
}

// TestMergePrefersLocal checks the duplicate rule in both slice orders: the
// copy on this node wins wherever it sits.
func TestMergePrefersLocal(t *testing.T) {
	slices := sourcetest.DecodeSlices(t, sliceHeader+`  name: web-a
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-2}]
---`+sliceHeader+`  name: web-b
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-1}]
`)
	want := map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): {sourcetest.ReadyEndpoint("10.0.0.1", 8080)}}
	for _, order := range [][]*discoveryv1.EndpointSlice{{slices[0], slices[1]}, {slices[1], slices[0]}} {
		got, err := EndpointsForService(webPorts(), order, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		sourcetest.MustEqual(t, "endpoints", got, want)
	}
	// Seen from node-3 neither copy is local: the first slice by name wins.
	got, _ := EndpointsForService(webPorts(), []*discoveryv1.EndpointSlice{slices[1], slices[0]}, "node-3")
	sourcetest.MustEqual(t, "endpoints from node-3", got, map[model.ServicePortName][]model.Endpoint{
		sourcetest.WebPortName("http"): {sourcetest.EndpointWith(sourcetest.ReadyEndpoint("10.0.0.1", 8080), func(e *model.Endpoint) { e.NodeName = "node-2" })},
	})
}

// TestEndpointConditions pins how unset conditions read: as upstream
// kube-proxy's EndpointSlice cache reads them, ready and serving default to
// true and terminating to false, each on its own.
func TestEndpointConditions(t *testing.T) {
	tests := []struct {
		name                        string
		ready, serving, terminating *bool
		want                        [3]bool // ready, serving, terminating
	}{
		{name: "all unset", want: [3]bool{true, true, false}},
		{name: "not ready, serving unset: still serving", ready: new(false), want: [3]bool{false, true, false}},
		{name: "ready, serving unset", ready: new(true), want: [3]bool{true, true, false}},
		{name: "not serving, ready unset", serving: new(false), want: [3]bool{true, false, false}},
		{name: "terminating, serving unset", ready: new(false), terminating: new(true), want: [3]bool{false, true, true}},
		{name: "terminating and serving", ready: new(false), serving: new(true), terminating: new(true), want: [3]bool{false, true, true}},
		{name: "terminating, not serving", ready: new(false), serving: new(false), terminating: new(true), want: [3]bool{false, false, true}},
		{name: "all set, ready", ready: new(true), serving: new(true), terminating: new(false), want: [3]bool{true, true, false}},
		{name: "ready but not serving", ready: new(true), serving: new(false), want: [3]bool{true, false, false}},
	}
	addr := netip.MustParseAddr("10.0.0.1")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := discoveryv1.Endpoint{
				Addresses:  []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: tt.ready, Serving: tt.serving, Terminating: tt.terminating},
			}
			got := convertEndpoint(addr, &e)
			if have := [3]bool{got.Ready, got.Serving, got.Terminating}; have != tt.want {
				t.Errorf("ready, serving, terminating = %v, want %v", have, tt.want)
			}
		})
	}
}

// A single-port slice sorted by address is merged without a copy; any
// other order, a repeated address or a second slice gives a sorted copy.
func TestMergeSharesSortedSlice(t *testing.T) {
	slices := sourcetest.DecodeSlices(t, sliceHeader+`  name: web-a
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-1}, {addresses: [10.0.0.2], nodeName: node-1}]
---`+sliceHeader+`  name: web-b
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.2], nodeName: node-1}, {addresses: [10.0.0.1], nodeName: node-1}]
---`+sliceHeader+`  name: web-c
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-1}, {addresses: [10.0.0.1], nodeName: node-2}]
`)
	infos := make([]*sliceInfo, len(slices))
	for i, es := range slices {
		info, err := parseEndpointSlice(es)
		if err != nil {
			t.Fatal(err)
		}
		infos[i] = info
	}
	both := []model.Endpoint{sourcetest.ReadyEndpoint("10.0.0.1", 8080), sourcetest.ReadyEndpoint("10.0.0.2", 8080)}
	for _, c := range []struct {
		name   string
		infos  []*sliceInfo
		want   []model.Endpoint
		shared bool
	}{
		{"sorted", infos[:1], both, true},
		{"unsorted", infos[1:2], both, false},
		{"repeated", infos[2:3], both[:1], false},
		{"two slices", infos[:2], both, false},
	} {
		got := mergeEndpoints(webPorts(), c.infos, "node-1")
		sourcetest.MustEqual(t, c.name, got, map[model.ServicePortName][]model.Endpoint{sourcetest.WebPortName("http"): c.want})
		if shared := &got[sourcetest.WebPortName("http")][0] == &c.infos[0].endpoints[0]; shared != c.shared {
			t.Errorf("%s: shared %v, want %v", c.name, shared, c.shared)
		}
	}
}
