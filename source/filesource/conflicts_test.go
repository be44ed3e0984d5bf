package filesource

import (
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// TestLoadStateNodePortConflict: two manifests asking for one NodePort load
// with the older Service keeping it, whatever the file order, and the
// conflict among the problems.
func TestLoadStateNodePortConflict(t *testing.T) {
	svc := func(name, created, ip string) string {
		return `
apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: default, creationTimestamp: "` + created + `"}
spec:
  type: NodePort
  clusterIP: ` + ip + `
  ports: [{name: http, port: 80, nodePort: 30080}]
`
	}
	older := svc("web-old", "2025-01-01T00:00:00Z", "10.96.0.1")
	newer := svc("web-new", "2025-06-01T00:00:00Z", "10.96.0.2")
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"older file first", map[string]string{"a.yaml": older, "b.yaml": newer}},
		{"newer file first", map[string]string{"a.yaml": newer, "b.yaml": older}},
		{"one file", map[string]string{"all.yaml": newer + "---" + older}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, tt.files)
			st, problems := LoadState(dir, "node-1")
			if st == nil {
				t.Fatalf("no state: %v", problems)
			}
			sourcetest.MustEqual(t, "services", sourcetest.Summarize(st), []string{
				"default/web-new:http TCP/80 cluster=10.96.0.2",
				"default/web-old:http TCP/80 cluster=10.96.0.1 np=30080",
			})
			sourcetest.CheckErrors(t, problems, `service default/web-new: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/web-old port "http", which keeps it; dropped`)
		})
	}
}
