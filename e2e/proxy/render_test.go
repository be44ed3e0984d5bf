package proxy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// badService has a clusterIP that is no IP address; the proxy must skip it
// and name it.
const badService = `apiVersion: v1
kind: Service
metadata:
  name: bad
  namespace: default
spec:
  type: NodePort
  clusterIP: 10.96.0.300
  clusterIPs: [10.96.0.300]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: 30099
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: bad-ipv4
  namespace: default
  labels:
    kubernetes.io/service-name: bad
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: [10.244.0.10]
  conditions: {ready: true}
  nodeName: node-1
`

// brokenYAML does not parse.
const brokenYAML = `apiVersion: v1
kind: Service
metadata: {name: broken, namespace: default
spec: [
`

// badInput are the files TestBadInput and TestRender add to the example
// state.
var badInput = map[string]string{
	"bad-service.yaml": badService,
	"broken.yaml":      brokenYAML,
}

// loadServiceCount is how many extra Services the scale tests add.
const loadServiceCount = 1000

// TestRender checks that `render` prints rules nft accepts (nft -c, in a
// network namespace of its own), for the example state, with bad input and
// with many Services; and that the example's rules, loaded by nft, list
// as the proxy's own do.
func TestRender(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, tc := range []struct {
		name   string
		extra  map[string]string
		stderr []string // what the warnings must name
		fails  bool     // render must exit non-zero
	}{
		{name: "example"},
		{name: "bad object", extra: map[string]string{"bad-service.yaml": badService}, stderr: []string{"default/bad"}},
		// A file that cannot be parsed hides what it holds: what the
		// proxy would program is unknown, so render refuses.
		{name: "unparsable file", extra: badInput, stderr: []string{"broken.yaml"}, fails: true},
		{name: "1000 services", extra: map[string]string{
			"load-services.yaml":       loadServices(loadServiceCount),
			"load-endpointslices.yaml": loadSlices(loadServiceCount, loadPortBase),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			if err := os.Mkdir(state, 0o755); err != nil {
				t.Fatal(err)
			}
			copyDir(t, exampleState, state)
			for name, data := range tc.extra {
				writeAtomic(t, state, name, data)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()

			cmd := exec.CommandContext(ctx, proxyBin, "render", "--state", state,
				"--hostname-override", nodeName, "--cluster-cidr", clusterCIDRs())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("render's warnings do not name %q:\n%s", want, stderr.Bytes())
				}
			}
			if tc.fails {
				if err == nil || stdout.Len() > 0 {
					t.Fatalf("render with an unparsable file: %v, %d bytes of rules; want a failure and no rules", err, stdout.Len())
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v: %s", err, stderr.Bytes())
			}
			for _, want := range []string{"table ip kube-nftproxy {", "table ip6 kube-nftproxy {", "chain " + svcChain(webSPN, "tcp") + " {"} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("render output has no %q", want)
				}
			}
			rules := filepath.Join(dir, "rules.nft")
			if err := os.WriteFile(rules, stdout.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}

			// unshare -n: a new, empty network namespace that goes
			// away with the command.
			if out, err := exec.CommandContext(ctx, "unshare", "--net", "nft", "-c", "-f", rules).CombinedOutput(); err != nil {
				t.Fatalf("nft -c -f rendered rules: %v\n%s", err, out)
			}
			if tc.extra != nil {
				return
			}
			out, err := exec.CommandContext(ctx, "unshare", "--net", "sh", "-ec", `nft -f "$1"; nft list ruleset`, "sh", rules).CombinedOutput()
			if err != nil {
				t.Fatalf("nft -f rendered rules, nft list ruleset: %v\n%s", err, out)
			}
			checkExampleRuleset(t, string(out))
		})
	}
}
