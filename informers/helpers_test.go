package informers

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// decodeAll decodes YAML with the package's own decoder and fails on any problem.
func decodeAll(t *testing.T, yaml string) []runtime.Object {
	t.Helper()
	d, err := NewDecoder()
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

func decodeService(t *testing.T, yaml string) *corev1.Service {
	t.Helper()
	objs := decodeAll(t, yaml)
	if len(objs) != 1 {
		t.Fatalf("want one object, got %d", len(objs))
	}
	svc, ok := objs[0].(*corev1.Service)
	if !ok {
		t.Fatalf("want a Service, got %T", objs[0])
	}
	return svc
}

func decodeSlices(t *testing.T, yaml string) []*discoveryv1.EndpointSlice {
	t.Helper()
	var out []*discoveryv1.EndpointSlice
	for _, o := range decodeAll(t, yaml) {
		es, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			t.Fatalf("want EndpointSlices, got %T", o)
		}
		out = append(out, es)
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// checkErrors wants exactly one error per substring, in any order.
func checkErrors(t *testing.T, errs []error, want ...string) {
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

func mustEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %s\n want %s", what, dump(got), dump(want))
	}
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
