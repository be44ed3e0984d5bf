package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// memCgroupServices and memCgroupLimit are TestCgroupMemoryCeiling's
// size and hard limit: a limit between what the proxy needs under the
// soft limit set from it (98-99 MiB at 4000 Services) and its peak when
// GOGC alone paces the collector (108-109 MiB), as the cgroup counts
// them (the kernel's nftables objects, 49 MiB, included). With
// KNP_MEMCG_LIMIT_MIB set the test only measures: set 4096 for the
// peaks; KNP_MEMCG_SERVICES changes the size.
const (
	memCgroupServices = 4000
	memCgroupLimit    = 104 << 20
)

// TestCgroupMemoryCeiling runs the command in standalone mode (--state:
// thousands of Services × 10 endpoints) in a network namespace and a
// memory cgroup of its own, whose hard limit lies below the proxy's peak
// when GOGC alone paces the collector: with GOMEMLIMIT=off (the user's
// opt-out) the kernel's OOM killer ends the first sync; by default the
// soft limit set from the cgroup's keeps the proxy under it, and the
// first sync completes. Root and a writable memory cgroup (v1, or v2
// with the memory controller delegated) or it skips.
func TestCgroupMemoryCeiling(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a memory cgroup and a network namespace")
	}
	own, err := findMemoryCgroup(os.DirFS("/"))
	if err != nil {
		t.Skipf("needs a memory cgroup: %v", err)
	}
	services, limit := envInt(t, "KNP_MEMCG_SERVICES", memCgroupServices), int64(envInt(t, "KNP_MEMCG_LIMIT_MIB", memCgroupLimit>>20))<<20
	state := writeScaleState(t, services)
	for _, tc := range []struct {
		name, gomemlimit string
		wantKilled       bool
	}{
		{"GOMEMLIMIT=off", "off", true},
		{"default", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := newTestMemoryCgroup(t, own, limit)
			r := runProxyInCgroup(t, cg, state, tc.gomemlimit)
			t.Logf("%d Services, hard limit %d MiB: cgroup peak %.1f MiB (kernel memory %s), process peak RSS %s, OOM kills %d, synced %v (took %s), exit %v",
				services, limit>>20, mib(uint64(cg.peak(t))), cg.kernelPeak(), r.peakRSS, cg.oomKills(t), r.synced, r.took, r.exit)
			if os.Getenv("KNP_MEMCG_LIMIT_MIB") != "" {
				return // measuring: whatever happened is the answer
			}
			switch killed := cg.oomKills(t) > 0; {
			case tc.wantKilled && (!killed || r.synced):
				t.Errorf("paced by GOGC alone, the proxy was not OOM-killed (synced %v, exit %v): raise KNP_MEMCG_SERVICES or lower the limit", r.synced, r.exit)
			case !tc.wantKilled && (killed || !r.synced):
				t.Errorf("under the cgroup's ceiling: OOM kills %d, synced %v, exit %v; logs:\n%s", cg.oomKills(t), r.synced, r.exit, r.logs)
			case !tc.wantKilled && !strings.Contains(r.logs, "soft limit set below the cgroup's limit"):
				t.Errorf("no log line of the soft limit set:\n%s", r.logs)
			}
		})
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// writeScaleState writes n ClusterIP Services (up to 60k), each with an
// EndpointSlice of 10 endpoints on another node, and the node, to a
// directory for --state, and checks that it loads.
func writeScaleState(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	var svc, eps strings.Builder
	for i := range n {
		ip := fmt.Sprintf("10.96.%d.%d", 1+i/250, 1+i%250)
		fmt.Fprintf(&svc, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: default}\n"+
			"spec: {type: ClusterIP, clusterIP: %s, clusterIPs: [%s], ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]}\n", i, ip, ip)
		fmt.Fprintf(&eps, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"+
			"metadata: {name: s%d-a, namespace: default, labels: {kubernetes.io/service-name: s%d}}\n"+
			"addressType: IPv4\nports: [{name: http, protocol: TCP, port: 8080}]\nendpoints:\n", i, i)
		for e := range 10 {
			k := i*10 + e
			fmt.Fprintf(&eps, "- {addresses: [100.%d.%d.%d], conditions: {ready: true}, nodeName: node-2}\n", 64+k>>16, k>>8&255, k&255)
		}
	}
	node := "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nspec: {podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24]}\n" +
		"status: {addresses: [{type: InternalIP, address: 10.99.0.1}]}\n"
	for name, text := range map[string]string{"services.yaml": svc.String(), "endpointslices.yaml": eps.String(), "node.yaml": node} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, problems := filesource.LoadState(dir, "node-1")
	if st == nil || len(problems) > 0 || st.Services.Len() != n {
		t.Fatalf("the generated state: %d Service ports, problems %v", st.Services.Len(), problems)
	}
	return dir
}

// testMemoryCgroup is a memory cgroup a test created under its own.
type testMemoryCgroup struct {
	dir string // absolute
	v2  bool
}

// newTestMemoryCgroup creates a child of the test's memory cgroup with
// hard limit limit (no swap beyond it), or skips the test. Cleanup kills
// what runs in it and removes it.
func newTestMemoryCgroup(t *testing.T, own memoryCgroup, limit int64) *testMemoryCgroup {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	cg := &testMemoryCgroup{dir: filepath.Join("/", own.dir, "knp-memtest-"+hex.EncodeToString(suffix)), v2: own.v2}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Skipf("needs a writable memory cgroup: %v", err)
	}
	t.Cleanup(func() { cg.remove(t) })
	limitFile, swapFile := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
	if cg.v2 {
		limitFile, swapFile = "memory.max", "memory.swap.max"
	}
	if _, err := os.Stat(filepath.Join(cg.dir, limitFile)); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("the memory controller is not enabled for %s's children (cgroup.subtree_control)", filepath.Dir(cg.dir))
	}
	cg.write(t, limitFile, strconv.FormatInt(limit, 10))
	swap := strconv.FormatInt(limit, 10)
	if cg.v2 {
		swap = "0"
	}
	_ = os.WriteFile(filepath.Join(cg.dir, swapFile), []byte(swap), 0o644) // absent without swap accounting
	return cg
}

func (cg *testMemoryCgroup) write(t *testing.T, name, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(cg.dir, name), []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// remove kills the processes left in the cgroup and removes it once they
// are gone.
func (cg *testMemoryCgroup) remove(t *testing.T) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		procs, err := os.ReadFile(filepath.Join(cg.dir, "cgroup.procs"))
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		if len(strings.TrimSpace(string(procs))) == 0 {
			break
		}
		for _, f := range strings.Fields(string(procs)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: processes %s still in %s", procs, cg.dir)
			return
		}
		time.Sleep(50 * time.Millisecond) // poll: the killed leave the cgroup as they exit
	}
	if err := os.Remove(cg.dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// peak is the cgroup's highest memory usage so far.
func (cg *testMemoryCgroup) peak(t *testing.T) int64 {
	name := "memory.max_usage_in_bytes"
	if cg.v2 {
		name = "memory.peak" // Linux 5.19
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// kernelPeak is the cgroup's highest kernel memory usage (v1: the
// kernel's nftables objects are charged to the cgroup that made them).
func (cg *testMemoryCgroup) kernelPeak() string {
	b, err := os.ReadFile(filepath.Join(cg.dir, "memory.kmem.max_usage_in_bytes"))
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f MiB", mib(n))
}

// oomKills is how many processes the OOM killer ended in the cgroup.
func (cg *testMemoryCgroup) oomKills(t *testing.T) int {
	name := "memory.oom_control"
	if cg.v2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no oom_kill in %s:\n%s", name, b)
	return 0
}

// proxyRun is what runProxyInCgroup saw.
type proxyRun struct {
	synced bool
	took   string // the first sync's, as logged
	exit   error  // nil: stopped by the test after syncing
	// peakRSS is the process's VmHWM once synced.
	peakRSS string
	logs    string
}

var tookRE = regexp.MustCompile(`took="?([^" ]+)"?`)

// runProxyInCgroup starts the command on state in a new network
// namespace, inside cg from its first instruction (a shell joins it, then
// execs the proxy), and waits for its first sync or its end. GOMEMLIMIT
// is gomemlimit ("": unset). After a sync, it checks that the proxy's
// table is in the namespace and stops the proxy.
func runProxyInCgroup(t *testing.T, cg *testMemoryCgroup, state, gomemlimit string) proxyRun {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(cg.dir, "cgroup.procs"),
		self, "--state", state, "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "", "--metrics-bind-address", "")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMEMLIMIT=") && !strings.HasPrefix(kv, "GOGC=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, mainEnv+"=1")
	if gomemlimit != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+gomemlimit)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs strings.Builder
	synced, exited := make(chan string, 1), make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), `"synced"`) {
				took := ""
				if m := tookRE.FindStringSubmatch(sc.Text()); m != nil {
					took = m[1]
				}
				select {
				case synced <- took:
				default:
				}
			}
		}
		exited <- cmd.Wait()
	}()
	var r proxyRun
	select {
	case r.took = <-synced:
		r.synced = true
		checkProxyTable(t, cmd.Process.Pid)
		r.peakRSS = fmt.Sprintf("%.1f MiB", statusMiBOf(t, cmd.Process.Pid, "VmHWM:"))
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			t.Errorf("the proxy's exit on SIGTERM: %v", err)
		}
	case r.exit = <-exited:
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		r.exit = <-exited
		t.Errorf("neither synced nor exited in 5 minutes")
	}
	mu.Lock()
	r.logs = logs.String()
	mu.Unlock()
	return r
}

// checkProxyTable checks that the proxy's table is in the network
// namespace of process pid.
func checkProxyTable(t *testing.T, pid int) {
	t.Helper()
	k, err := nftlib.OpenKernel(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	tables, err := k.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == nft.DefaultTableName {
			return
		}
	}
	t.Errorf("no table %s in the proxy's namespace: %v", nft.DefaultTableName, tables)
}
