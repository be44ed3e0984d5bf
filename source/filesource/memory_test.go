package filesource

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// memChildEnv, when set, makes TestLargeFileMemory the child that loads
// the state directory it names and reports its memory.
const memChildEnv = "KNP_FILESOURCE_MEM_CHILD"

// largeStateEnv sets the size of TestLargeFileMemory's files in MiB (10 by
// default; 60 measures files just under MaxFileSize, in a minute or two).
const largeStateEnv = "KNP_LARGE_STATE_MIB"

// memManifest is ClusterIP Service i and its EndpointSlice, as kubectl
// writes them (block style).
func memManifest(i int) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata:
  name: svc-%[1]d
  namespace: mem
spec:
  clusterIP: 10.%[2]d.%[3]d.%[4]d
  clusterIPs:
  - 10.%[2]d.%[3]d.%[4]d
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  selector:
    app: svc-%[1]d
  type: ClusterIP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%[1]d-abcde
  namespace: mem
  labels:
    kubernetes.io/service-name: svc-%[1]d
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
- addresses:
  - 10.64.%[3]d.%[4]d
  conditions:
    ready: true
  nodeName: node-1
`, i, 96+i>>16, byte(i>>8), byte(i))
}

// kubectlManifest is Service i and its EndpointSlice with what `kubectl
// get -o yaml` of objects made by `kubectl apply` and the EndpointSlice
// controller also shows: uid, resourceVersion, creationTimestamp, the
// last-applied annotation, owner references, endpoints' targetRefs.
func kubectlManifest(i int) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app":"svc-%[1]d"},"name":"svc-%[1]d","namespace":"mem"},"spec":{"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}],"selector":{"app":"svc-%[1]d"}}}
  creationTimestamp: "2026-11-01T10:00:00Z"
  labels:
    app: svc-%[1]d
  name: svc-%[1]d
  namespace: mem
  resourceVersion: "%[5]d"
  uid: 6f1c%08[1]d-1c2d-4e5f-8a9b-0c1d2e3f4a5b
spec:
  clusterIP: 10.%[2]d.%[3]d.%[4]d
  clusterIPs:
  - 10.%[2]d.%[3]d.%[4]d
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  selector:
    app: svc-%[1]d
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "2026-11-01T10:00:01Z"
  creationTimestamp: "2026-11-01T10:00:01Z"
  generateName: svc-%[1]d-
  generation: 1
  labels:
    app: svc-%[1]d
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
    kubernetes.io/service-name: svc-%[1]d
  name: svc-%[1]d-abcde
  namespace: mem
  ownerReferences:
  - apiVersion: v1
    blockOwnerDeletion: true
    controller: true
    kind: Service
    name: svc-%[1]d
    uid: 6f1c%08[1]d-1c2d-4e5f-8a9b-0c1d2e3f4a5b
  resourceVersion: "%[6]d"
  uid: 7a2d%08[1]d-2d3e-4f5a-9b0c-1d2e3f4a5b6c
addressType: IPv4
endpoints:
- addresses:
  - 10.64.%[3]d.%[4]d
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-1
  targetRef:
    kind: Pod
    name: svc-%[1]d-7d9c5b6f4-x2x7k
    namespace: mem
    uid: 8b3e%08[1]d-3e4f-4a5b-8c1d-2e3f4a5b6c7d
ports:
- name: http
  port: 8080
  protocol: TCP
`, i, 96+i>>16, byte(i>>8), byte(i), 1000+2*i, 1001+2*i)
}

// writeLargeState writes one file of at least size bytes of Services and
// their slices, each pair written by gen, and returns its directory and
// the number of Services.
func writeLargeState(t *testing.T, size int, gen func(int) string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "state.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	n, written := 0, 0
	for ; written < size; n++ {
		k, _ := w.WriteString(gen(n))
		written += k
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, n
}

// TestLargeFileMemory loads a state file (10 MiB; set largeStateEnv to 60
// for one just under MaxFileSize) in a process of its own, once with bare
// objects and once as kubectl shows them, and reports its memory: the peak
// resident set, the resident set once the load is done, the live heap and
// the free heap not handed back to the kernel, which must be small. Before
// the change, the load of 60 MiB of bare objects peaked at 1,004 MiB and
// kept 985 MiB.
func TestLargeFileMemory(t *testing.T) {
	if dir := os.Getenv(memChildEnv); dir != "" {
		loadAndReport(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("skipping in -short: loads a large state file")
	}
	mib := 10
	if v := os.Getenv(largeStateEnv); v != "" {
		var err error
		if mib, err = strconv.Atoi(v); err != nil || mib <= 0 || mib > MaxFileSize>>20 {
			t.Fatalf("%s=%q: want MiB, 1 to %d", largeStateEnv, v, MaxFileSize>>20)
		}
	}
	for _, style := range []struct {
		name string
		gen  func(int) string
	}{{"bare", memManifest}, {"kubectl", kubectlManifest}} {
		t.Run(style.name, func(t *testing.T) {
			dir, services := writeLargeState(t, mib<<20, style.gen)
			m := measureLoad(t, dir)
			t.Logf("%d MiB, %d Services and their slices: took %d ms, peak RSS %d MiB, RSS after %d MiB, live heap %d MiB, free heap kept from the kernel %d MiB",
				mib, services, m["took"], m["peak"]>>10, m["rss"]>>10, m["heap"]>>10, m["kept"]>>10)
			// The heap the parse freed is handed back: what the process
			// keeps unused is small next to what it holds.
			if maxKept := 16<<10 + m["heap"]/10; m["kept"] > maxKept {
				t.Errorf("%d MiB of free heap kept from the kernel after the load, want at most %d MiB", m["kept"]>>10, maxKept>>10)
			}
		})
	}
}

// measureLoad runs the child on dir and returns what it measured.
func measureLoad(t *testing.T, dir string) map[string]int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLargeFileMemory$", "-test.v")
	cmd.Env = append(os.Environ(), memChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	return parseMem(t, string(out))
}

// loadAndReport is the child: it loads dir as the file source does and
// prints "MEM took=… peak=… rss=… heap=…" (KiB).
func loadAndReport(t *testing.T, dir string) {
	src, err := NewFileSource(dir, "node-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st *model.State
	src.OnState = func(s *model.State) { st = s }
	t0 := time.Now()
	src.reload()
	took := time.Since(t0)
	if st == nil || st.Services.Len() == 0 {
		t.Fatalf("load: no State handed out")
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	hwm, rss := procStatus(t, "VmHWM"), procStatus(t, "VmRSS")
	fmt.Printf("MEM took=%d peak=%d rss=%d heap=%d kept=%d\n", took.Milliseconds(), hwm, rss, ms.HeapAlloc>>10, (ms.HeapIdle-ms.HeapReleased)>>10)
	runtime.KeepAlive(src)
	runtime.KeepAlive(st)
}

// procStatus is a KiB field of /proc/self/status.
func procStatus(t *testing.T, key string) int {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", key)
	return 0
}

// parseMem reads the child's MEM line.
func parseMem(t *testing.T, out string) map[string]int {
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "MEM ")
		if !ok {
			continue
		}
		m := map[string]int{}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			m[k], _ = strconv.Atoi(v)
		}
		return m
	}
	t.Fatalf("the child printed no MEM line:\n%s", out)
	return nil
}
