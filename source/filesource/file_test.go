package filesource

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
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
		if manifest.IsWarning(e) {
			warnings = append(warnings, e)
		} else {
			errs = append(errs, e)
		}
	}
	sourcetest.CheckErrors(t, errs,
		p("services.yaml")+`:12: Service default/broken-spec: json: cannot unmarshal array into Go struct field Service.spec of type v1.ServiceSpec, skipped`,
		p("services.yaml")+`:17: Service default/wrong-type: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32, skipped`,
		p("services.yaml")+`:48: Service no-version: apiVersion is missing, skipped`,
		p("list.yaml")+`:1 items[1]: endpointslice default/web-abc: endpoints[1]: invalid IP address "10.244.0.999", endpoint skipped`,
		p("list.yaml")+`:1 items[4]: service default/bad-ip: spec.clusterIPs[0]: invalid IP address "10.96.0.300", service skipped`,
	)
	sourcetest.CheckErrors(t, warnings,
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
	sourcetest.MustEqual(t, "services", got, want)
	sourcetest.MustEqual(t, "web cluster IPs (the later definition wins)", st.Services.Get(sourcetest.WebPortName("http")).ClusterIPs, sourcetest.Addrs("10.96.0.10"))
	sourcetest.MustEqual(t, "web endpoints", st.Endpoints.Get(sourcetest.WebPortName("http")), []model.Endpoint{sourcetest.ReadyEndpoint("10.244.0.10", 8080)})
	sourcetest.MustEqual(t, "node", st.Node, model.Node{Name: "node-1", Zone: "zone-a", PodCIDRs: sourcetest.Prefixes("10.244.0.0/24")})
}

func TestLoadStateSingleFileAnyName(t *testing.T) {
	dir := writeFiles(t, map[string]string{"state.txt": sourcetest.WebService + "\n"})
	st, problems := LoadState(filepath.Join(dir, "state.txt"), "node-1")
	if len(problems) != 0 || st == nil {
		t.Fatalf("state %v, problems %v", st, problems)
	}
	if _, ok := st.Services.Lookup(sourcetest.WebPortName("http")); !ok {
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

// TestLoadKubectlOutput reads what `kubectl get svc,endpointslices,nodes -A
// -o yaml` prints: a List of mixed kinds full of server-set fields, none of
// which may cause a complaint.
func TestLoadKubectlOutput(t *testing.T) {
	st, problems := LoadState("testdata/kubectl-get.yaml", "kind-control-plane")
	if len(problems) > 0 || st == nil {
		t.Fatalf("problems: %v", problems)
	}
	k8s := model.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https"}
	dns := model.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}
	dnsTCP := model.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp"}
	sourcetest.MustEqual(t, "services", st.SortedNames(), []model.ServicePortName{k8s, dns, dnsTCP})
	if p := st.Services.Get(dns); p.Protocol != model.UDP || p.Port != 53 {
		t.Errorf("kube-dns:dns = %+v", p)
	}
	coredns := model.Endpoint{Addr: sourcetest.Addrs("10.244.0.3")[0], NodeName: "kind-control-plane", Ready: true, Serving: true}
	sourcetest.MustEqualEntries(t, "endpoints", st.Endpoints, map[model.ServicePortName][]model.Endpoint{
		k8s:    {{Addr: sourcetest.Addrs("172.18.0.2")[0], Port: 6443, Ready: true, Serving: true}},
		dns:    {sourcetest.EndpointWith(coredns, func(e *model.Endpoint) { e.Port = 53 })},
		dnsTCP: {sourcetest.EndpointWith(coredns, func(e *model.Endpoint) { e.Port = 53 })},
	})
	sourcetest.MustEqual(t, "node", st.Node, model.Node{
		Name: "kind-control-plane", Zone: "zone-a",
		PodCIDRs: sourcetest.Prefixes("10.244.0.0/24"), IPs: sourcetest.Addrs("172.18.0.2"),
	})
}

// TestLoadStateBuilderOptions: the Builder's options reach it, so render,
// diff and trace can honour AllowServiceExternalIPs as the proxy does.
func TestLoadStateBuilderOptions(t *testing.T) {
	ext := strings.Replace(sourcetest.WebService, "  ports:", "  externalIPs: [192.0.2.50]\n  ports:", 1)
	dir := writeFiles(t, map[string]string{"web.yaml": ext + "\n"})
	for _, tt := range []struct {
		name string
		opts []kube.Option
		want []netip.Addr
	}{
		{"no options", nil, sourcetest.Addrs("192.0.2.50")},
		{"gate on", []kube.Option{kube.AllowExternalIPs(true, nil)}, sourcetest.Addrs("192.0.2.50")},
		{"gate off", []kube.Option{kube.AllowExternalIPs(false, nil)}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, problems := LoadState(dir, "node-1", tt.opts...)
			if len(problems) != 0 || st == nil {
				t.Fatalf("state %v, problems %v", st, problems)
			}
			p := st.Services.Get(sourcetest.WebPortName("http"))
			if p == nil {
				t.Fatal("default/web:http is not in the State")
			}
			sourcetest.MustEqual(t, "external IPs", p.ExternalIPs, tt.want)
		})
	}
}
