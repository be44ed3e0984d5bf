package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// badInputMemoryLimit bounds the proxy's peak resident memory (VmHWM,
// reset before each case) while it reads one bad input: generous (the
// proxy needs 30 MiB on the example state, 90 MiB with 10,000 endpoints),
// but far below what reading /dev/zero or expanding an alias bomb would
// take. hugeFileMemoryLimit is the bound for the 50 MB file, which the
// proxy reads (it refuses files over 64 MiB): parsing YAML into objects
// takes about nine times the file (430-500 MiB), so this bound only
// catches growth without end. memoryKillLimit is where the test kills a
// proxy that keeps growing, before it hurts the machine.
const (
	badInputMemoryLimit = 256 << 10 // KiB
	hugeFileMemoryLimit = 768 << 10
	memoryKillLimit     = 1 << 20
)

// The good Services of a kind: List file, which a syntax error in that file
// must not take away.
const (
	listedFile = "listed.yaml"
	listedName = "listed"
	listedIP   = "10.96.0.30"
)

// listedYAML is the List file holding listed's Service and EndpointSlice
// (endpoints pods), as `kubectl get -o yaml` prints it; broken adds a
// syntax error at its end.
func listedYAML(broken bool, pods ...sandbox.Pod) string {
	items := []string{
		service{namespace: "default", name: listedName, clusterIP: netip.MustParseAddr(listedIP), portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		endpointSlice{namespace: "default", name: listedName + "-ipv4", service: listedName, portName: "http", protocol: "TCP", port: podTCPPort, pods: pods}.yaml(),
	}
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nmetadata: {}\nitems:\n")
	for _, it := range items {
		for i, line := range strings.Split(strings.TrimSuffix(it, "\n"), "\n") {
			if i == 0 {
				b.WriteString("- " + line + "\n")
			} else {
				b.WriteString("  " + line + "\n")
			}
		}
	}
	if broken {
		b.WriteString("- kind: Service\n  metadata: {name: [oops\n")
	}
	return b.String()
}

// badServiceYAML is a one-port TCP Service in default, as YAML, with fields
// given verbatim so that they can be wrong.
func badServiceYAML(name, clusterIP, protocol, port, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: default
spec:
  clusterIP: %s
  clusterIPs: [%[2]s]
  ports:
  - name: http
    protocol: %s
    port: %s
    targetPort: 8080
%s`, name, clusterIP, protocol, port, extra)
}

// aliasBomb is a YAML "billion laughs": nine levels of nine aliases.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c <= 'i'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&b, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p)
	}
	b.WriteString("kind: Service\napiVersion: v1\nmetadata: {name: bomb, namespace: default}\n")
	return b.String()
}

// manyPorts is a Service with n TCP ports (1..n, all to 8080) and pod-a
// and pod-b behind them.
func manyPorts(name, clusterIP string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec:\n  clusterIP: %s\n  clusterIPs: [%[2]s]\n  ports:\n", name, clusterIP)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - {name: p%d, protocol: TCP, port: %d, targetPort: 8080}\n", i, i)
	}
	return b.String()
}

// manyEndpoints is a Service with an EndpointSlice of n ready endpoints in
// 10.246.0.0/16, where nothing answers.
func manyEndpoints(name, clusterIP string, n int) string {
	var b strings.Builder
	b.WriteString(badServiceYAML(name, clusterIP, "TCP", "80", ""))
	fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-ipv4\n  namespace: default\n  labels: {kubernetes.io/service-name: %[1]s}\naddressType: IPv4\nports: [{name: http, protocol: TCP, port: 8080}]\nendpoints:\n", name)
	for i := range n {
		fmt.Fprintf(&b, "- {addresses: [\"10.246.%d.%d\"], conditions: {ready: true}, nodeName: node-2}\n", i/250, 1+i%250)
	}
	return b.String()
}

// badInputCase is one bad input written into the watched state directory.
type badInputCase struct {
	name string
	// file is the directory entry the case creates (and the log must
	// name, unless quiet); apply creates it, undo removes it (or puts
	// back what was there).
	file        string
	apply, undo func(t *testing.T, e *env)
	// object is the namespace/name the log must name as well, if any.
	object string
	// quiet: valid but extreme input that the proxy may program or
	// refuse; then accepted says whether it was programmed, and the log
	// must name the file only if it was not.
	quiet    bool
	accepted func(ruleset string) bool
	// check, if set, runs once the input has been read.
	check func(t *testing.T, e *env)
	// memLimit bounds the proxy's peak memory in KiB; 0 means
	// badInputMemoryLimit.
	memLimit int
}

func writeCase(name, file, object, data string) badInputCase {
	return badInputCase{name: name, file: file, object: object,
		apply: func(t *testing.T, e *env) { writeAtomic(t, e.state, file, data) }}
}

// TestFaultBadInput writes, one at a time, each kind of bad input into the
// watched state directory while the example's Services carry traffic: the
// proxy must stay up (alive, /livez 200), its memory bounded, the other
// Services must answer throughout, later changes must still be followed,
// and its log must name the file (and the object, where there is one).
func TestFaultBadInput(t *testing.T) {
	e := newEnv(t, envOptions{
		pods:  []sandbox.Pod{podA, podB, podC},
		extra: map[string]string{listedFile: listedYAML(false, podA, podB)},
	})
	// Errors about the state directory and its files are fine here;
	// others are not.
	e.proxy.expectedErrors = []string{e.state}
	listed := hostPort(listedIP, "80")
	e.waitTraffic(t, time.Now(), 10*time.Second, listed, podA.Name, podB.Name)

	junk := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range junk {
		junk[i] = byte(rng.UintN(256))
	}
	huge := "apiVersion: v1\nkind: Service\nmetadata:\n  name: huge\n  namespace: default\n  annotations:\n    pad: \"" +
		strings.Repeat("x", 50<<20) + "\"\nspec: {clusterIP: 10.96.2.250, ports: []}\n"
	remove := func(file string) func(t *testing.T, e *env) {
		return func(t *testing.T, e *env) {
			if err := os.Remove(filepath.Join(e.state, file)); err != nil {
				t.Fatal(err)
			}
		}
	}
	restoreListed := func(t *testing.T, e *env) { writeAtomic(t, e.state, listedFile, listedYAML(false, podA, podB)) }

	cases := []badInputCase{
		writeCase("unparsable YAML", "broken.yaml", "", brokenYAML),
		writeCase("invalid IP", "bad-ip.yaml", "default/bad-ip", badServiceYAML("bad-ip", "10.96.0.300", "TCP", "80", "")),
		writeCase("invalid port", "bad-port.yaml", "default/bad-port", badServiceYAML("bad-port", "10.96.2.11", "TCP", "70000", "")),
		writeCase("unknown protocol", "bad-proto.yaml", "default/bad-proto", badServiceYAML("bad-proto", "10.96.2.12", "QUIC", "80", "")),
		writeCase("Service without ports", "no-ports.yaml", "default/no-ports",
			"apiVersion: v1\nkind: Service\nmetadata: {name: no-ports, namespace: default}\nspec: {clusterIP: 10.96.2.13, clusterIPs: [10.96.2.13], ports: []}\n"),
		// Ranked after default/web (same creation time, then by name), so
		// web keeps its NodePort.
		writeCase("two Services with one NodePort", "zz-dup-nodeport.yaml", "default/zz-dup",
			badServiceYAML("zz-dup", "10.96.2.14", "TCP", "80", "    nodePort: "+webNodePort+"\n  type: NodePort\n")),
		writeCase("binary junk", "junk.yaml", "", string(junk)),
		func() badInputCase {
			c := writeCase("50 MB file", "huge.yaml", "", huge)
			c.memLimit = hugeFileMemoryLimit
			return c
		}(),
		writeCase("YAML alias bomb", "bomb.yaml", "", aliasBomb()),
		writeCase("IPv6 addresses in an IPv4 EndpointSlice", "v6-in-v4.yaml", "default/mixed-ipv4", documents(
			badServiceYAML("mixed", "10.96.2.15", "TCP", "80", ""),
			strings.ReplaceAll(endpointSlice{namespace: "default", name: "mixed-ipv4", service: "mixed", portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{podA}}.yaml(),
				podA.IPv4.String(), podA.IPv6.String()))),
		{name: "Service with 1,000 ports", file: "many-ports.yaml", quiet: true,
			apply: func(t *testing.T, e *env) {
				writeAtomic(t, e.state, "many-ports.yaml", manyPorts("many-ports", "10.96.2.16", 1000))
			},
			accepted: func(rs string) bool { return strings.Count(rs, "10.96.2.16 . tcp . ") == 1000 }},
		{name: "EndpointSlice with 10,000 endpoints", file: "many-endpoints.yaml", quiet: true,
			apply: func(t *testing.T, e *env) {
				writeAtomic(t, e.state, "many-endpoints.yaml", manyEndpoints("many-endpoints", "10.96.2.17", 10_000))
			},
			accepted: func(rs string) bool { return strings.Count(rs, "dnat to 10.246.") == 10_000 }},
		{name: "syntax error in a kind: List file of good Services", file: listedFile,
			apply: func(t *testing.T, e *env) { writeAtomic(t, e.state, listedFile, listedYAML(true, podA, podB)) },
			undo:  restoreListed,
			check: func(t *testing.T, e *env) {
				if !strings.Contains(e.nftRuleset(t), listedIP) {
					t.Errorf("the List file's good Service %s (%s) is gone from the ruleset", listedName, listedIP)
				}
				sum := e.requests(t, podC.Name, "tcp", listed, requestsPerCheck)
				expectBackends(t, "the List file's good Service", sum, podA.Name, podB.Name)
			}},
		{name: "FIFO", file: "fifo.yaml",
			apply: func(t *testing.T, e *env) {
				if err := syscall.Mkfifo(filepath.Join(e.state, "fifo.yaml"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, e *env) {
				// A reader blocked on the FIFO gets EOF once a writer
				// has come and gone.
				path := filepath.Join(e.state, "fifo.yaml")
				if fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					t.Logf("someone was blocked reading the FIFO; unblocked it")
					syscall.Close(fd)
				}
				remove("fifo.yaml")(t, e)
			}},
		{name: "symlink to /dev/zero", file: "zero.yaml",
			apply: func(t *testing.T, e *env) { symlink(t, "/dev/zero", filepath.Join(e.state, "zero.yaml")) }},
		// Root reads a chmod 000 file; a symlink to itself cannot be read
		// by anyone (ELOOP).
		{name: "unreadable entry (symlink loop)", file: "loop.yaml",
			apply: func(t *testing.T, e *env) { symlink(t, "loop.yaml", filepath.Join(e.state, "loop.yaml")) }},
		{name: "file replaced by rename while watched", file: listedFile, quiet: true,
			apply: func(t *testing.T, e *env) {
				// writeAtomic renames a new file over the old one: the
				// watch must follow the name, twice.
				writeAtomic(t, e.state, listedFile, listedYAML(false, podB))
				e.waitTraffic(t, time.Now(), 10*time.Second, listed, podB.Name)
				writeAtomic(t, e.state, listedFile, listedYAML(false, podA))
				e.waitTraffic(t, time.Now(), 10*time.Second, listed, podA.Name)
			},
			undo: restoreListed},
		{name: "state directory removed and restored", quiet: true,
			apply: func(t *testing.T, e *env) { removeStateDir(t, e) }},
	}
	for i, tc := range cases {
		if tc.undo == nil && tc.file != "" {
			tc.undo = remove(tc.file)
		}
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", e.proxy.proc.Pid()), []byte("5"), 0); err != nil {
				t.Fatalf("resetting the proxy's VmHWM: %v", err)
			}
			stopWatchdog := e.memoryWatchdog(t, memoryKillLimit)
			defer stopWatchdog()
			f := e.startExampleFlows(t)
			logged := len(e.proxy.log.lines())
			t0 := time.Now()
			if tc.undo != nil {
				t.Cleanup(func() { tc.undo(t, e) })
			}
			tc.apply(t, e)
			if !tc.quiet || tc.accepted != nil {
				mustLog := []string{tc.file}
				if tc.object != "" {
					mustLog = append(mustLog, tc.object)
				}
				outcome := "refused, with a warning naming it"
				err := e.proxy.try(t.Context(), 10*time.Second, func(context.Context) error {
					if tc.accepted != nil && tc.accepted(e.nftRuleset(t)) {
						outcome = "programmed"
						return nil
					}
					if !warned(e.proxy.log.lines()[logged:], mustLog...) {
						return fmt.Errorf("no warning or error naming %q in the proxy's log", mustLog)
					}
					return nil
				})
				if err != nil {
					// What it did say about them, if anything.
					var near []string
					for _, l := range e.proxy.log.lines()[logged:] {
						if warned([]string{l}) && slices.ContainsFunc(mustLog, func(s string) bool { return strings.Contains(l, s) }) {
							near = append(near, l)
						}
					}
					t.Errorf("the proxy did not report %s: %v; warnings naming part of it: %q", tc.file, err, firstN(near, 3))
				} else {
					t.Logf("%s: %s", tc.file, outcome)
				}
			}
			read := time.Since(t0)
			if tc.check != nil {
				tc.check(t, e)
			}
			// Changes are still followed (the proxy is not stuck on a
			// FIFO or a never-ending file).
			canary(t, e, i)
			if tc.memLimit == 0 {
				tc.memLimit = badInputMemoryLimit
			}
			e.expectAlive(t, tc.memLimit)
			res := f.stop(t)
			logFault(t, "bad input: "+tc.name, -1, res)
			t.Logf("%s: read (logged or programmed) %v after it was written", tc.name, read.Round(time.Millisecond))
			res.expectNoFailures(t, tc.name)
		})
		// A dead proxy, or one that kept the memory of a big input, is
		// started afresh so that the next case is judged on its own.
		if e.proxy.proc.Exited() {
			t.Errorf("the proxy died after %s; starting it again for the next case", tc.name)
			e.resetProxy(t)
		} else if _, rss, err := procMemory(e.proxy.proc.Pid()); err == nil && rss > badInputMemoryLimit {
			t.Logf("the proxy holds %d MiB after %s; starting it again for the next case", rss>>10, tc.name)
			e.resetProxy(t)
		}
	}
	e.expectAlive(t, badInputMemoryLimit)
}

// memoryWatchdog kills the proxy (and fails the test) if its resident
// memory passes limitKiB, until the returned function is called.
func (e *env) memoryWatchdog(t *testing.T, limitKiB int) (stop func()) {
	p := e.proxy
	done := make(chan struct{})
	killed := make(chan int, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-p.proc.Done():
				return
			case <-tick.C:
			}
			if _, rss, err := procMemory(p.proc.Pid()); err == nil && rss > limitKiB {
				p.exitJudged.Store(true)
				_ = p.proc.Signal(syscall.SIGKILL)
				killed <- rss
				return
			}
		}
	}()
	return func() {
		close(done)
		select {
		case rss := <-killed:
			t.Errorf("the proxy's resident memory reached %d MiB, past %d MiB: killed it", rss>>10, limitKiB>>10)
		default:
		}
	}
}

// warned reports whether one of the lines is a warning or an error that
// contains every one of the strings.
func warned(lines []string, all ...string) bool {
	for _, l := range lines {
		if !isWarningLine(l) && !isErrorLine(l) {
			continue
		}
		found := true
		for _, s := range all {
			found = found && strings.Contains(l, s)
		}
		if found {
			return true
		}
	}
	return false
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

// canaryIP is the ClusterIP of the Service the bad input test changes
// after each case.
const canaryIP = "10.96.2.100"

// canary writes canary.yaml, a Service whose one endpoint alternates
// between pod-a and pod-b with n, and waits until traffic follows.
func canary(t *testing.T, e *env, n int) {
	t.Helper()
	pod := []sandbox.Pod{podA, podB}[n%2]
	writeAtomic(t, e.state, "canary.yaml", documents(
		service{namespace: "default", name: "canary", clusterIP: netip.MustParseAddr(canaryIP), portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		endpointSlice{namespace: "default", name: "canary-ipv4", service: "canary", portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{pod}}.yaml(),
	))
	t0 := time.Now()
	err := e.proxy.try(t.Context(), 10*time.Second, func(ctx context.Context) error {
		return e.probe(ctx, hostPort(canaryIP, "80"), 16, pod.Name)
	})
	if err != nil {
		t.Fatalf("a change written after the bad input (canary.yaml: endpoint %s) did not reach the kernel: the proxy no longer follows the state directory: %v", pod.Name, err)
	}
	t.Logf("a later change (canary to %s) reached the kernel after %v", pod.Name, time.Since(t0).Round(time.Millisecond))
}

// expectAlive checks that the proxy runs, answers /livez with 200 and that
// its peak resident memory is below limitKiB, and logs the memory.
func (e *env) expectAlive(t *testing.T, limitKiB int) {
	t.Helper()
	e.proxy.checkRunning(t)
	code, body, err := e.health(t.Context(), "/livez")
	if err != nil || code != 200 {
		t.Errorf("/livez: %d %q, %v; want 200", code, body, err)
	}
	hwm, rss, err := procMemory(e.proxy.proc.Pid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY proxy VmHWM %d MiB, VmRSS %d MiB", hwm>>10, rss>>10)
	if hwm > limitKiB {
		t.Errorf("the proxy's peak resident memory (VmHWM) is %d MiB, over the bound of %d MiB", hwm>>10, limitKiB>>10)
	}
}

// removeStateDir removes the watched state directory, waits for the proxy
// to say so (naming it), checks that the rules stay, and puts the
// directory back as it was.
func removeStateDir(t *testing.T, e *env) {
	t.Helper()
	files := map[string]string{}
	entries, err := os.ReadDir(e.state)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		if !de.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(e.state, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[de.Name()] = string(data)
	}
	// The chains the last change emptied are deleted a second after it:
	// that is no change of the rules, but it would show in the listing.
	e.waitStaleChainsDeleted(t)
	before := testutil.SortedListing(e.nftRuleset(t))
	logged := len(e.proxy.log.lines())
	if err := os.RemoveAll(e.state); err != nil {
		t.Fatal(err)
	}
	e.proxy.poll(t, 20*time.Second, "a warning naming the removed state directory", func(context.Context) error {
		if !warned(e.proxy.log.lines()[logged:], e.state) {
			return fmt.Errorf("no warning or error naming %s in the proxy's log", e.state)
		}
		return nil
	})
	// Over two of the watcher's settle times and a sync: the rules stay.
	deadline := time.Now().Add(3 * time.Second)
	e.proxy.poll(t, 10*time.Second, "3s with the directory gone", func(context.Context) error {
		if d := testutil.ListingDiff(testutil.SortedListing(e.nftRuleset(t)), before, "the kernel now", "the kernel before"); d != "" {
			t.Fatalf("with the state directory gone, the rules changed: %s", d)
		}
		if time.Now().Before(deadline) {
			return fmt.Errorf("still watching")
		}
		return nil
	})
	// Restored whole, as a directory renamed into place: copied file by
	// file, the proxy would (rightly) program each file as it comes, and
	// the conntrack cleanup would end UDP flows of Services whose files
	// are not back yet.
	restore := e.state + ".restore"
	if err := os.Mkdir(restore, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		writeAtomic(t, restore, name, data)
	}
	if err := os.Rename(restore, e.state); err != nil {
		t.Fatal(err)
	}
}
