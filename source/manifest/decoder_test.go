package manifest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDecodeBadItemAlone: one bad item of a list costs that item only,
// whatever the kind of list.
func TestDecodeBadItemAlone(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // names of the objects decoded
		errs     []string
	}{{
		name: "ServiceList",
		in: `{"apiVersion": "v1", "kind": "ServiceList", "items": [
  {"metadata": {"name": "good"}, "spec": {"ports": [{"port": 80}]}},
  {"metadata": {"name": "bad"}, "spec": {"ports": [{"port": "eighty"}]}},
  {"kind": "Service", "apiVersion": "v1", "metadata": {"name": "own-kind"}}]}`,
		want: []string{"good", "own-kind"},
		errs: []string{`f.json:1 items[1]: Service bad: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32, skipped`},
	}, {
		name: "List",
		in: `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: good}}
- {apiVersion: v1, kind: Service, metadata: {name: bad}, spec: {ports: [{port: eighty}]}}
`,
		want: []string{"good"},
		errs: []string{`f.json:1 items[1]: Service bad: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32, skipped`},
	}, {
		name: "EndpointSliceList",
		in: `apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- {metadata: {name: good}, addressType: IPv4}
- {metadata: {name: bad}, addressType: IPv4, ports: [{port: x}]}
`,
		want: []string{"good"},
		errs: []string{`f.json:1 items[1]: EndpointSlice bad: json: cannot unmarshal string into Go struct field EndpointPort.ports.port of type int32, skipped`},
	}}
	d, err := manifest.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, errs := d.Decode([]byte(tt.in), "f.json")
			var got []string
			for _, o := range objs {
				got = append(got, o.Obj.(metav1.Object).GetName())
			}
			sourcetest.MustEqual(t, "objects", got, tt.want)
			sourcetest.CheckErrors(t, errs, tt.errs...)
		})
	}
}

// TestDecodeLineNumbers: messages count lines from the top of the file,
// however far down the document is.
func TestDecodeLineNumbers(t *testing.T) {
	in := strings.Repeat("---\na: 1\n", 500) + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x\n"
	d, err := manifest.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	_, errs := d.Decode([]byte(in), "f.yaml")
	var se *manifest.SyntaxError
	if len(errs) == 0 || !errors.As(errs[len(errs)-1], &se) {
		t.Fatalf("want a SyntaxError last, got %v", errs)
	}
	want := "f.yaml:1002: invalid YAML in the document starting here: yaml: line 1004: did not find expected ',' or '}'"
	if got := errs[len(errs)-1].Error(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if se.File != "f.yaml" || se.Line != 1002 {
		t.Errorf("SyntaxError at %s:%d", se.File, se.Line)
	}
}
