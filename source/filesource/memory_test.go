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

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// memChildEnv, when set, makes TestLargeFileMemory the child that loads
// the state directory it names and reports its memory.
const memChildEnv = "KNP_FILESOURCE_MEM_CHILD"

// largeStateEnv sets the size of TestLargeFileMemory's file in MiB (10 by
// default; 60 measures a file just under MaxFileSize, in a minute or two).
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

// writeLargeState writes one file of at least size bytes of Services and
// their slices and returns its directory and the number of Services.
func writeLargeState(t *testing.T, size int) (string, int) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "state.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	n, written := 0, 0
	for ; written < size; n++ {
		k, _ := w.WriteString(memManifest(n))
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

// TestLargeFileMemory loads a state file of 60 MiB, just under
// MaxFileSize, in a process of its own and reports its memory: the peak
// resident set, the resident set once the load is done, the live heap and
// the free heap not handed back to the kernel, which must be small. Before
// the change, the load of 60 MiB peaked at 1,004 MiB and kept 985 MiB.
func TestLargeFileMemory(t *testing.T) {
	if dir := os.Getenv(memChildEnv); dir != "" {
		loadAndReport(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("skipping in -short: loads a 60 MiB state file")
	}
	mib := 10
	if v := os.Getenv(largeStateEnv); v != "" {
		var err error
		if mib, err = strconv.Atoi(v); err != nil || mib <= 0 || mib > MaxFileSize>>20 {
			t.Fatalf("%s=%q: want MiB, 1 to %d", largeStateEnv, v, MaxFileSize>>20)
		}
	}
	dir, services := writeLargeState(t, mib<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLargeFileMemory$", "-test.v")
	cmd.Env = append(os.Environ(), memChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	m := parseMem(t, string(out))
	t.Logf("%d MiB, %d Services and their slices: took %d ms, peak RSS %d MiB, RSS after %d MiB, live heap %d MiB, free heap kept from the kernel %d MiB",
		mib, services, m["took"], m["peak"]>>10, m["rss"]>>10, m["heap"]>>10, m["kept"]>>10)
	// The heap the parse freed is handed back: what the process keeps
	// unused is small next to what it holds.
	if maxKept := 16<<10 + m["heap"]/10; m["kept"] > maxKept {
		t.Errorf("%d MiB of free heap kept from the kernel after the load, want at most %d MiB", m["kept"]>>10, maxKept>>10)
	}
}

// loadAndReport is the child: it loads dir as the file source does and
// prints "MEM took=… peak=… rss=… heap=…" (KiB).
func loadAndReport(t *testing.T, dir string) {
	src, err := NewFileSource(dir, "node-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st *proxier.State
	src.OnState = func(s *proxier.State) { st = s }
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
