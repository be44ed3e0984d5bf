package model

import (
	"cmp"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// Compare orders names as their String forms, including where a name's
// parts and separators interleave ('-' sorts before '/', ':' after '.').
func TestServicePortNameCompare(t *testing.T) {
	names := []ServicePortName{
		{Namespace: "a", Name: "b", Port: "c"},
		{Namespace: "a", Name: "b"},
		{Namespace: "a", Name: "b", Port: "d"},
		{Namespace: "a-b", Name: "c"},
		{Namespace: "a", Name: "b-c", Port: "d"},
		{Namespace: "a", Name: "b.c", Port: "d"},
		{Namespace: "a", Name: "b:c"},
		{Namespace: "a", Name: "b", Port: "c:d"},
		{Namespace: "ab", Name: ""},
		{Namespace: "", Name: "a/b"},
		{Namespace: "a", Name: "b/", Port: "x"},
		{Namespace: "a", Name: "b", Port: ""},
		{},
	}
	for _, x := range names {
		for _, y := range names {
			if got, want := x.Compare(y), cmp.Compare(x.String(), y.String()); got != want {
				t.Errorf("%q.Compare(%q) = %d, want %d", x, y, got, want)
			}
		}
	}
}

// The hand-written comparisons must cover every field: a field added to
// ServicePort, Endpoint or Node that Equal does not compare would make the
// change tracker miss its changes. Each field is changed alone, and the
// comparison must see it (Node.Leaving changes no rule, by design).
func TestEqualCoversEveryField(t *testing.T) {
	sp := ServicePort{Name: ServicePortName{Namespace: "ns", Name: "web", Port: "http"}, Protocol: TCP, Port: 80}
	forEachFieldChanged(t, sp, nil, func(name string, o ServicePort) bool { return sp.Equal(&o) })
	ep := Endpoint{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80}
	forEachFieldChanged(t, ep, nil, func(name string, o Endpoint) bool { return EndpointsEqual([]Endpoint{ep}, []Endpoint{o}) })
	n := Node{Name: "node-1"}
	forEachFieldChanged(t, n, []string{"Leaving"}, func(name string, o Node) bool { return n.Equal(o) })
}

// forEachFieldChanged calls equal with a copy of v in which one field (or
// one field of a struct field) differs, for each of them, and fails t
// when equal still says true; ignored fields are expected to compare equal.
func forEachFieldChanged[T any](t *testing.T, v T, ignored []string, equal func(field string, o T) bool) {
	t.Helper()
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		f := typ.Field(i)
		paths := [][]int{{i}}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(netip.Addr{}) {
			paths = nil
			for j := range f.Type.NumField() {
				paths = append(paths, []int{i, j})
			}
		}
		for _, path := range paths {
			o := v
			field := reflect.ValueOf(&o).Elem().FieldByIndex(path)
			name := typ.String() + "." + typ.FieldByIndex(path[:1]).Name
			if len(path) > 1 {
				name += "." + f.Type.Field(path[1]).Name
			}
			changeValue(t, name, field)
			if got, want := equal(name, o), slices.Contains(ignored, f.Name); got != want {
				t.Errorf("changing %s alone: equal = %v, want %v", name, got, want)
			}
		}
	}
}

// changeValue sets v to a value other than its own.
func changeValue(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	switch {
	case v.Type() == reflect.TypeOf(netip.Addr{}):
		v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.77")))
	case v.Kind() == reflect.Bool:
		v.SetBool(!v.Bool())
	case v.CanInt():
		v.SetInt(v.Int() + 1)
	case v.CanUint():
		v.SetUint(v.Uint() + 1)
	case v.Kind() == reflect.String:
		v.SetString(v.String() + "x")
	case v.Kind() == reflect.Slice:
		v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
	default:
		t.Fatalf("%s: no way to change a %s here: teach changeValue", name, v.Type())
	}
}
