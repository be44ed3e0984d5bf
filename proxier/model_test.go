package proxier

import (
	"cmp"
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
