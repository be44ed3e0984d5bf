package filesource

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchManifest is Service i and its EndpointSlice as two YAML documents.
func benchManifest(i int) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: svc-%[1]d, namespace: bench}
spec:
  type: NodePort
  clusterIP: 10.%[2]d.%[3]d.%[4]d
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: %[5]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%[1]d-abcde
  namespace: bench
  labels: {kubernetes.io/service-name: svc-%[1]d}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- {addresses: [10.64.%[3]d.%[4]d], nodeName: node-1, conditions: {ready: true}}
`, i, 96+i>>16, byte(i>>8), byte(i), 1+i%65535)
}

// writeBenchState writes objects Services with their slices (2*objects/2
// documents in all) spread over files files.
func writeBenchState(b *testing.B, objects, files int) string {
	b.Helper()
	dir := b.TempDir()
	services := objects / 2
	for f := range files {
		var sb strings.Builder
		for i := f; i < services; i += files {
			sb.WriteString(benchManifest(i))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("state-%03d.yaml", f)), []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkLoadState loads 10,000 objects (5,000 Services and their
// slices) from one file and from 100 files.
func BenchmarkLoadState(b *testing.B) {
	for _, files := range []int{1, 100} {
		b.Run(fmt.Sprintf("objects=10000/files=%d", files), func(b *testing.B) {
			dir := writeBenchState(b, 10_000, files)
			b.ResetTimer()
			for range b.N {
				st, problems := LoadState(dir, "node-1")
				if st == nil || len(problems) > 0 || st.Services.Len() != 5_000 {
					b.Fatalf("bad load: %d problems, first %v", len(problems), problems)
				}
			}
		})
	}
}

// BenchmarkFileSetReloadOneFile changes one of 100 files holding 10,000
// objects and reloads: only that file is read and parsed again.
func BenchmarkFileSetReloadOneFile(b *testing.B) {
	dir := writeBenchState(b, 10_000, 100)
	set, err := newFileSet(dir, "node-1")
	if err != nil {
		b.Fatal(err)
	}
	set.racyWindow = 0 // the files were written just now; trust their timestamps
	if res := set.reload(); !res.complete {
		b.Fatalf("first load: %v", res.failures)
	}
	set.b.State()
	path := filepath.Join(dir, "state-042.yaml")
	orig, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	changed := []byte(strings.ReplaceAll(string(orig), "port: 80,", "port: 81,"))
	b.ResetTimer()
	for i := range b.N {
		body := orig
		if i%2 == 0 {
			body = changed
		}
		if err := os.WriteFile(path, body, 0o644); err != nil {
			b.Fatal(err)
		}
		if res := set.reload(); !res.complete || len(res.problems) > 0 {
			b.Fatalf("reload: %v %v", res.failures, res.problems)
		}
		if st := set.b.State(); st.Services.Len() != 5_000 {
			b.Fatalf("%d services", st.Services.Len())
		}
	}
}
