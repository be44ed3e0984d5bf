package informers

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// manifests is a directory as a user might keep it: several files, several
// kinds, lists, JSON, and a fair amount of trouble.
var manifests = map[string]string{
	"a-dup.yml": `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.99.99, ports: [{name: http, port: 80}]}
`,
	"services.yaml": `# leading comment
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
# an empty document
---
apiVersion: v1
kind: Service
metadata: {name: broken-spec, namespace: default}
spec: [1]
---
apiVersion: v1
kind: Service
metadata: {name: wrong-type, namespace: default}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: http, port: eighty}]
---
apiVersion: v1
kind: Service
metadata: {name: extra-field, namespace: default}
spec:
  clusterIP: 10.96.0.12
  colour: blue
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data: {a: b}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, protocol: UDP, port: 53}]
---
kind: Service
metadata: {name: no-version}
`,
	"list.yaml": `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: from-list, namespace: default}
  spec:
    clusterIP: 10.96.0.20
    ports: [{name: http, port: 80}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-abc
    namespace: default
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, protocol: TCP, port: 8080}]
  endpoints:
  - {addresses: [10.244.0.10], nodeName: node-1, conditions: {ready: true}}
  - {addresses: [10.244.0.999], nodeName: node-1}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1, labels: {topology.kubernetes.io/zone: zone-a}}
  spec: {podCIDR: 10.244.0.0/24}
- apiVersion: v1
  kind: Pod
  metadata: {name: pod-a, namespace: default}
- apiVersion: v1
  kind: Service
  metadata: {name: bad-ip, namespace: default}
  spec:
    clusterIP: 10.96.0.300
    ports: [{name: http, port: 80}]
kind: List
`,
	"typed.json": `{
  "apiVersion": "v1",
  "kind": "ServiceList",
  "items": [
    {"metadata": {"name": "json-svc", "namespace": "default"},
     "spec": {"clusterIP": "10.96.0.30", "ports": [{"name": "http", "port": 80}]}}
  ]
}`,
	".hidden.yaml": "this is not: [yaml",
	"notes.txt":    "neither is: [this",
}

func TestLoadState(t *testing.T) {
	dir := writeFiles(t, manifests)
	st, problems := LoadState(dir, "node-1")
	if st == nil {
		t.Fatalf("no state; problems: %v", problems)
	}
	p := func(file string) string { return filepath.Join(dir, file) }

	var errs, warnings []error
	for _, e := range problems {
		if IsWarning(e) {
			warnings = append(warnings, e)
		} else {
			errs = append(errs, e)
		}
	}
	checkErrors(t, errs,
		p("services.yaml")+`:12: Service default/broken-spec: json: cannot unmarshal array into Go struct field Service.spec of type v1.ServiceSpec, skipped`,
		p("services.yaml")+`:17: Service default/wrong-type: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32, skipped`,
		p("services.yaml")+`:48: Service no-version: apiVersion is missing, skipped`,
		p("list.yaml")+`:1 items[1]: endpointslice default/web-abc: endpoints[1]: invalid IP address "10.244.0.999", endpoint skipped`,
		p("list.yaml")+`:1 items[4]: service default/bad-ip: spec.clusterIPs[0]: invalid IP address "10.96.0.300", service skipped`,
	)
	checkErrors(t, warnings,
		p("list.yaml")+`:1: yaml: unmarshal errors:`+"\n"+`  line 34: key "kind" already set in map`,
		p("services.yaml")+`:3: service default/web is also defined at `+p("a-dup.yml")+`:2; this later one wins`,
		p("services.yaml")+`:24: Service default/extra-field: strict decoding error: unknown field "spec.colour"`,
		p("services.yaml")+`:32: ConfigMap default/settings: kind "ConfigMap" is not used by the proxy, skipped`,
		p("services.yaml")+`:37: Deployment default/web: kind "Deployment" of apiVersion "apps/v1" is not used by the proxy, skipped`,
		p("list.yaml")+`:1 items[3]: Pod default/pod-a: kind "Pod" is not used by the proxy, skipped`,
	)

	want := []string{"default/extra-field:http", "default/from-list:http", "default/json-svc:http", "default/web:http", "kube-system/dns:dns"}
	var got []string
	for _, n := range st.SortedNames() {
		got = append(got, n.String())
	}
	mustEqual(t, "services", got, want)
	mustEqual(t, "web cluster IPs (the later definition wins)", st.Services[spn("http")].ClusterIPs, addrs("10.96.0.10"))
	mustEqual(t, "web endpoints", st.Endpoints[spn("http")], []proxier.Endpoint{ep("10.244.0.10", 8080)})
	mustEqual(t, "node", st.Node, proxier.Node{Name: "node-1", Zone: "zone-a", PodCIDRs: prefixes("10.244.0.0/24")})
}

func TestLoadStateSingleFileAnyName(t *testing.T) {
	dir := writeFiles(t, map[string]string{"state.txt": builderWeb + "\n"})
	st, problems := LoadState(filepath.Join(dir, "state.txt"), "node-1")
	if len(problems) != 0 || st == nil {
		t.Fatalf("state %v, problems %v", st, problems)
	}
	if _, ok := st.Services[spn("http")]; !ok {
		t.Errorf("service missing: %v", st.Services)
	}
}

func TestLoadStateMissingPath(t *testing.T) {
	st, problems := LoadState(filepath.Join(t.TempDir(), "nope"), "node-1")
	if st != nil {
		t.Errorf("want no state for a missing path, got %v", st)
	}
	if len(problems) != 1 || !strings.Contains(problems[0].Error(), "no such file") {
		t.Errorf("problems = %v", problems)
	}
}

func TestSplitDocuments(t *testing.T) {
	tests := []struct {
		in    string
		lines []int
		docs  []string
	}{
		{"a: 1\n", []int{1}, []string{"a: 1\n"}},
		{"---\na: 1\n---\nb: 2\n", []int{1, 2, 4}, []string{"", "a: 1\n", "b: 2\n"}},
		{"a: 1\n--- # comment\nb: 2\n...\n", []int{1, 3}, []string{"a: 1\n", "b: 2\n"}},
		{"# c\n\na: 1\n---\n\n# c\nb: 2\n", []int{3, 7}, []string{"# c\n\na: 1\n", "\n# c\nb: 2\n"}},
		{"a: 1\n--- {b: 2}\n", []int{1, 2}, []string{"a: 1\n", " {b: 2}\n"}},
		{"a: 1\r\n---\r\nb: 2\r\n", []int{1, 3}, []string{"a: 1\r\n", "b: 2\r\n"}},
		{"a: '---'\nb: |\n  ---x\n", []int{1}, []string{"a: '---'\nb: |\n  ---x\n"}},
	}
	for _, tt := range tests {
		docs := splitDocuments([]byte(tt.in))
		var lines []int
		var texts []string
		for _, d := range docs {
			lines = append(lines, d.line)
			texts = append(texts, string(d.data))
		}
		mustEqual(t, "lines of "+tt.in, lines, tt.lines)
		mustEqual(t, "docs of "+tt.in, texts, tt.docs)
	}
}

// TestLoadKubectlOutput reads what `kubectl get svc,endpointslices,nodes -A
// -o yaml` prints: a List of mixed kinds full of server-set fields, none of
// which may cause a complaint.
func TestLoadKubectlOutput(t *testing.T) {
	st, problems := LoadState("testdata/kubectl-get.yaml", "kind-control-plane")
	if len(problems) > 0 || st == nil {
		t.Fatalf("problems: %v", problems)
	}
	k8s := proxier.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https"}
	dns := proxier.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}
	dnsTCP := proxier.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp"}
	mustEqual(t, "services", st.SortedNames(), []proxier.ServicePortName{k8s, dns, dnsTCP})
	if p := st.Services[dns]; p.Protocol != proxier.UDP || p.Port != 53 {
		t.Errorf("kube-dns:dns = %+v", p)
	}
	coredns := proxier.Endpoint{Addr: addrs("10.244.0.3")[0], NodeName: "kind-control-plane", Ready: true, Serving: true}
	mustEqual(t, "endpoints", st.Endpoints, map[proxier.ServicePortName][]proxier.Endpoint{
		k8s:    {{Addr: addrs("172.18.0.2")[0], Port: 6443, Ready: true, Serving: true}},
		dns:    {epWith(coredns, func(e *proxier.Endpoint) { e.Port = 53 })},
		dnsTCP: {epWith(coredns, func(e *proxier.Endpoint) { e.Port = 53 })},
	})
	mustEqual(t, "node", st.Node, proxier.Node{
		Name: "kind-control-plane", Zone: "zone-a",
		PodCIDRs: prefixes("10.244.0.0/24"), IPs: addrs("172.18.0.2"),
	})
}

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
	d, err := NewDecoder()
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
			mustEqual(t, "objects", got, tt.want)
			checkErrors(t, errs, tt.errs...)
		})
	}
}

// TestDecodeLineNumbers: messages count lines from the top of the file,
// however far down the document is.
func TestDecodeLineNumbers(t *testing.T) {
	in := strings.Repeat("---\na: 1\n", 500) + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x\n"
	d, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	_, errs := d.Decode([]byte(in), "f.yaml")
	var se *SyntaxError
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
