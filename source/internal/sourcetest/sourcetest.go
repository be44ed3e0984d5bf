// Package sourcetest holds the helpers the tests of the source packages
// share: decoding test manifests and comparing results readably.
package sourcetest

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Decode decodes YAML with the manifest decoder and fails on any problem.
func Decode(t *testing.T, yaml string) []runtime.Object {
	t.Helper()
	d, err := manifest.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := d.Decode([]byte(yaml), "test.yaml")
	if len(errs) > 0 {
		t.Fatalf("decoding test YAML: %v", errs)
	}
	out := make([]runtime.Object, len(objs))
	for i, o := range objs {
		out[i] = o.Obj
	}
	return out
}

// DecodeService decodes the one Service in yaml.
func DecodeService(t *testing.T, yaml string) *corev1.Service {
	t.Helper()
	objs := Decode(t, yaml)
	if len(objs) != 1 {
		t.Fatalf("want one object, got %d", len(objs))
	}
	svc, ok := objs[0].(*corev1.Service)
	if !ok {
		t.Fatalf("want a Service, got %T", objs[0])
	}
	return svc
}

// DecodeSlices decodes the EndpointSlices in yaml.
func DecodeSlices(t *testing.T, yaml string) []*discoveryv1.EndpointSlice {
	t.Helper()
	var out []*discoveryv1.EndpointSlice
	for _, o := range Decode(t, yaml) {
		es, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			t.Fatalf("want EndpointSlices, got %T", o)
		}
		out = append(out, es)
	}
	return out
}

// Addrs parses addresses.
func Addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// Prefixes parses CIDRs.
func Prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// CheckErrors wants exactly one error per substring, in any order.
func CheckErrors(t *testing.T, errs []error, want ...string) {
	t.Helper()
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d:\n%s", len(errs), len(want), joinMessages(errs))
		return
	}
	used := make([]bool, len(errs))
outer:
	for _, w := range want {
		for i, e := range errs {
			if !used[i] && strings.Contains(e.Error(), w) {
				used[i] = true
				continue outer
			}
		}
		t.Errorf("no error contains %q; got:\n%s", w, joinMessages(errs))
	}
}

func joinMessages(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  %v\n", e)
	}
	return b.String()
}

// MustEqual fails the test, printing both, unless got and want are deeply equal.
func MustEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %s\n want %s", what, dump(got), dump(want))
	}
}

// MustEqualEntries fails unless got holds exactly the entries of want
// (nil and empty alike).
func MustEqualEntries[V any](t *testing.T, what string, got model.PortMap[V], want map[model.ServicePortName]V) {
	t.Helper()
	entries := map[model.ServicePortName]V{}
	for k, v := range got.All() {
		entries[k] = v
	}
	if len(want) == 0 {
		want = map[model.ServicePortName]V{}
	}
	MustEqual(t, what, entries, want)
}

// dump prints pointers' targets so slices of *ServicePort compare readably.
func dump(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Slice {
		parts := make([]string, rv.Len())
		for i := range parts {
			parts[i] = fmt.Sprintf("%+v", reflect.Indirect(rv.Index(i)).Interface())
		}
		return "[" + strings.Join(parts, ",\n       ") + "]"
	}
	return fmt.Sprintf("%+v", v)
}

// Summarize prints a state's service ports one a line, with the values
// conflicts can take away.
func Summarize(st *model.State) []string {
	out := []string{}
	for _, n := range st.SortedNames() {
		sp := st.Services.Get(n)
		s := fmt.Sprintf("%s %s/%d", n, sp.Protocol, sp.Port)
		for _, f := range []struct {
			name string
			ips  []netip.Addr
		}{{"cluster", sp.ClusterIPs}, {"ext", sp.ExternalIPs}, {"lb", sp.LoadBalancerIPs}} {
			if len(f.ips) > 0 {
				s += " " + f.name + "=" + joinAddrs(f.ips)
			}
		}
		if sp.NodePort != 0 {
			s += fmt.Sprintf(" np=%d", sp.NodePort)
		}
		out = append(out, s)
	}
	return out
}

func joinAddrs(ips []netip.Addr) string {
	ss := make([]string, len(ips))
	for i, ip := range ips {
		ss[i] = ip.String()
	}
	return strings.Join(ss, ",")
}

// WebPortName names port of Service default/web.
func WebPortName(port string) model.ServicePortName {
	return model.ServicePortName{Namespace: "default", Name: "web", Port: port}
}

// ReadyEndpoint is a ready, serving endpoint on node-1.
func ReadyEndpoint(addr string, port uint16) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: port, NodeName: "node-1", Ready: true, Serving: true}
}

// EndpointWith is e changed by f.
func EndpointWith(e model.Endpoint, f func(*model.Endpoint)) model.Endpoint {
	f(&e)
	return e
}

// WebService is Service default/web, port http 80, without a type.
const WebService = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]`

// kernelKey is a key of the kernel's maps a service port is programmed
// with: an address, protocol and port, or a NodePort of one family.
type kernelKey struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
	ipv6  bool
}

// CheckUniqueKeys fails if a state holds a kernel map key twice: an
// address and port, or a NodePort of one family.
func CheckUniqueKeys(t *testing.T, what string, st *model.State) {
	t.Helper()
	seen := map[kernelKey]model.ServicePortName{}
	for _, n := range st.SortedNames() {
		sp := st.Services.Get(n)
		var keys []kernelKey
		for _, ips := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, ip := range ips {
				keys = append(keys, kernelKey{addr: ip, proto: sp.Protocol, port: sp.Port})
			}
		}
		for _, v6 := range []bool{false, true} {
			hasFamily := slices.ContainsFunc(sp.ClusterIPs, func(ip netip.Addr) bool { return ip.Unmap().Is6() == v6 })
			if np := sp.NodePortIn(v6); np != 0 && hasFamily {
				keys = append(keys, kernelKey{proto: sp.Protocol, port: np, ipv6: v6})
			}
		}
		for _, k := range keys {
			if other, dup := seen[k]; dup {
				t.Errorf("%s: key %v is in both %s and %s", what, k, other, n)
			}
			seen[k] = n
		}
	}
}
