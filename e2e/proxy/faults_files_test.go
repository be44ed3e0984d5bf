package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// filesSyncPeriod is the proxy's --iptables-sync-period in these tests:
// /readyz turns 503 after a source failure of twice that, and a failed
// read is retried at least that often.
const filesSyncPeriod = 2 * time.Second

// TestFaultFileTransientReadError: the proxy runs out of file descriptors
// (its RLIMIT_NOFILE lowered from outside, a real EMFILE) just as a new
// Service is renamed into the state directory, and stays so for longer
// than /readyz tolerates. When descriptors are free again, nothing in the
// directory changes: the proxy must read it again by itself, program the
// Service and report healthy.
func TestFaultFileTransientReadError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC},
		proxyArgs: []string{"--iptables-sync-period", filesSyncPeriod.String()}})
	// Whatever else needs a descriptor meanwhile fails as well (a sync's
	// netlink socket): those are the fault, not a bug.
	e.proxy.expectedErrors = []string{"too many open files"}
	f := e.startExampleFlows(t)

	const name, ip = "retried", "10.96.2.110"
	body := documents(
		service{namespace: "default", name: name, clusterIP: netip.MustParseAddr(ip), portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		endpointSlice{namespace: "default", name: name + "-ipv4", service: name, portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{podA}}.yaml())
	tmp := filepath.Join(e.state, ".retried.tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	logged := len(e.proxy.log.lines())
	restore := starveDescriptors(t, e.proxy.proc.Pid())
	if err := os.Rename(tmp, filepath.Join(e.state, name+".yaml")); err != nil {
		restore()
		t.Fatal(err)
	}
	e.proxy.waitLog(t, 10*time.Second, "the failure to read the state", func(lines []string) bool {
		return warned(lines[logged:], e.state, "too many open files")
	})
	// The fault lasts past 2x the sync period, when /readyz turns 503
	// (not checked: its server cannot accept a connection meanwhile).
	time.Sleep(2*filesSyncPeriod + 500*time.Millisecond) // the fault's duration, not a synchronization
	restore()
	released := time.Now()

	var programmed, healthy time.Duration
	err := e.proxy.try(t.Context(), 4*filesSyncPeriod+5*time.Second, func(ctx context.Context) error {
		if programmed == 0 {
			if err := e.probe(ctx, hostPort(ip, "80"), 4, podA.Name); err != nil {
				return err
			}
			programmed = time.Since(released)
		}
		code, body, err := e.health(ctx, "/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("/readyz: %d %q %v", code, body, err)
		}
		healthy = time.Since(released)
		return nil
	})
	if err != nil {
		t.Fatalf("no file event followed the end of the read failure, and the proxy did not read the state again by itself: %v", err)
	}
	res := f.stop(t)
	t.Logf("descriptors free again -> the new Service programmed after %v, /readyz 200 after %v", programmed.Round(time.Millisecond), healthy.Round(time.Millisecond))
	logFault(t, "state directory unreadable for 4.5 s (EMFILE), a Service added meanwhile", programmed, res)
	res.expectNoFailures(t, "transient read error")
}

// starveDescriptors lowers process pid's RLIMIT_NOFILE to its lowest free
// descriptor, so that its next open fails with EMFILE; restore undoes it.
func starveDescriptors(t *testing.T, pid int) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	// The limit is the lowest free descriptor number, so no new one can be
	// opened. A descriptor the proxy holds for a moment (a leftover look's
	// socket) leaves a hole below the limit once closed: look again until
	// three looks 20 ms apart find no hole, lowering the limit to each.
	low := old
	low.Cur = lowestFreeFD(t, pid)
	for stable := 0; stable < 3; {
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &low, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the interval between looks, not a synchronization
		if free := lowestFreeFD(t, pid); free < low.Cur {
			low.Cur, stable = free, 0
			continue
		}
		stable++
	}
	t.Logf("the proxy's RLIMIT_NOFILE lowered to %d (from %d)", low.Cur, old.Cur)
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
			t.Errorf("restoring the proxy's RLIMIT_NOFILE: %v", err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// lowestFreeFD is the lowest descriptor number pid does not have open.
func lowestFreeFD(t *testing.T, pid int) uint64 {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	open := map[uint64]bool{}
	for _, de := range entries {
		if n, err := strconv.ParseUint(de.Name(), 10, 64); err == nil {
			open[n] = true
		}
	}
	var free uint64
	for open[free] {
		free++
	}
	return free
}

// manyServices is n ClusterIP Services, one YAML document each, in
// 10.96.64.0/18 (n at most 16,000).
func manyServices(n int) string {
	docs := make([]string, n)
	for i := range docs {
		docs[i] = service{namespace: "default", name: fmt.Sprintf("many-%04d", i),
			clusterIP: netip.AddrFrom4([4]byte{10, 96, byte(64 + i/250), byte(1 + i%250)}), portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml()
	}
	return documents(docs...)
}

// TestFaultFileCutShort: a state file of 300 Services rewritten in place
// by a writer that stopped half-way (a full disk), at a page boundary in
// the middle of a document, then at a document boundary. The first must
// take nothing away (held as being written, then refused, with warnings
// naming the file); the second, valid, must log the Services it removes.
func TestFaultFileCutShort(t *testing.T) {
	t.Parallel()
	const file, count = "many.yaml", 300
	full := manyServices(count)
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{file: full}})
	e.proxy.expectedErrors = []string{e.state}
	path := filepath.Join(e.state, file)
	last := fmt.Sprintf("10.96.%d.%d ", 64+(count-1)/250, 1+(count-1)%250)
	e.proxy.poll(t, 10*time.Second, "the 300 Services in the ruleset", func(context.Context) error {
		if !strings.Contains(e.nftRuleset(t), last) {
			return errors.New("not yet")
		}
		return nil
	})
	f := e.startExampleFlows(t)

	// Cut in the middle of a document, at a 4 KiB page as a full disk cuts.
	cut := len(full) / 2 &^ 4095
	if full[cut-1] == '\n' {
		cut++ // a page that ends a line ends no line of the next one: keep the test about a cut line
	}
	logged := len(e.proxy.log.lines())
	t0 := time.Now()
	if err := os.WriteFile(path, []byte(full[:cut]), 0o644); err != nil {
		t.Fatal(err)
	}
	e.proxy.waitLog(t, 10*time.Second, "a warning that the file is held", func(lines []string) bool {
		return warned(lines[logged:], path, "still being written")
	})
	heldAfter := time.Since(t0)
	e.proxy.waitLog(t, 15*time.Second, "the file refused as cut short", func(lines []string) bool {
		return warned(lines[logged:], path, "cut short?")
	})
	refusedAfter := time.Since(t0)
	if rs := e.nftRuleset(t); !strings.Contains(rs, last) {
		t.Errorf("the file cut at byte %d of %d took the Services after the cut away", cut, len(full))
	}

	// Cut at a document boundary: a valid file of 200 Services.
	boundary := strings.Index(full, "  name: many-0200\n")
	boundary = strings.LastIndex(full[:boundary], "---\n") + len("---\n")
	logged = len(e.proxy.log.lines())
	if err := os.WriteFile(path, []byte(full[:boundary]), 0o644); err != nil {
		t.Fatal(err)
	}
	e.proxy.waitLog(t, 10*time.Second, "the removal logged", func(lines []string) bool {
		for _, l := range lines[logged:] {
			if strings.Contains(l, "Services removed") && strings.Contains(l, "count=100") && strings.Contains(l, "default/many-0200") && strings.Contains(l, path) {
				return true
			}
		}
		return false
	})
	// Whole again.
	writeAtomic(t, e.state, file, full)
	e.proxy.poll(t, 10*time.Second, "the 300 Services back", func(context.Context) error {
		if !strings.Contains(e.nftRuleset(t), last) {
			return errors.New("not yet")
		}
		return nil
	})
	res := f.stop(t)
	t.Logf("cut at byte %d of %d: warned (held) after %v, refused after %v; no Service lost", cut, len(full), heldAfter.Round(time.Millisecond), refusedAfter.Round(time.Millisecond))
	logFault(t, "a file of 300 Services cut short mid-document (held, then kept), then at a document boundary (removal of 100 logged)", -1, res)
	res.expectNoFailures(t, "file cut short")
}

// TestFaultFileEmptiedOrRenamed: the example's Services file, grown to 100
// Services, under traffic to two of them (web and dns-like). It is
// truncated to nothing and written again a second later, as a failed
// `kubectl get ... > file` followed by a good one leaves it; then made
// invalid in place and renamed within the directory, and fixed under its
// new name a second later. Neither may take a Service out of the kernel
// for a moment: each is held, with a warning naming the file.
func TestFaultFileEmptiedOrRenamed(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile(filepath.Join(exampleState, "services.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const file, renamed = "services.yaml", "renamed.yaml"
	full := documents(string(example), manyServices(98))
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{file: full}})
	e.proxy.expectedErrors = []string{e.state}
	path, newPath := filepath.Join(e.state, file), filepath.Join(e.state, renamed)
	const last = "10.96.64.98 " // many-0097's ClusterIP
	e.proxy.poll(t, 10*time.Second, "the 100 Services in the ruleset", func(context.Context) error {
		if !strings.Contains(e.nftRuleset(t), last) {
			return errors.New("not yet")
		}
		return nil
	})
	f := e.startExampleFlows(t)
	rules := e.sampleRules(t)

	// Emptied, then written again in place a second later.
	logged := len(e.proxy.log.lines())
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the writer's pause: the fault's duration, not a synchronization
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	emptied := logged

	// Invalid in place, then renamed; fixed under the new name.
	logged = len(e.proxy.log.lines())
	if err := os.WriteFile(path, []byte(strings.Replace(full, "name: web\n", "name: {web\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	e.proxy.waitLog(t, 10*time.Second, "the invalid file refused", func(lines []string) bool {
		return warned(lines[logged:], path, "invalid YAML")
	})
	if err := os.Rename(path, newPath); err != nil {
		t.Fatal(err)
	}
	e.proxy.waitLog(t, 10*time.Second, "the renamed file refused", func(lines []string) bool {
		return warned(lines[logged:], newPath, "invalid YAML")
	})
	time.Sleep(time.Second) // the fault's duration, not a synchronization
	writeAtomic(t, e.state, renamed, full)
	e.proxy.waitLog(t, 10*time.Second, "the renamed file read", func(lines []string) bool {
		return slices.ContainsFunc(lines[logged:], func(l string) bool { return strings.Contains(l, "reads fine again") })
	})
	rules.expectAlways(t, "emptied and rewritten; invalid and renamed")
	if !warned(e.proxy.log.lines()[emptied:], path, "it is empty", "still being written") {
		t.Errorf("no warning that the emptied %s is held", path)
	}
	if rs := e.nftRuleset(t); !strings.Contains(rs, last) {
		t.Errorf("many-0097 (%s) is gone from the ruleset", last)
	}
	res := f.stop(t)
	logFault(t, "a file of 100 Services emptied and written again 1 s later; then made invalid in place, renamed, and fixed 1 s later (held, warnings naming the file)", -1, res)
	res.expectNoFailures(t, "file emptied or renamed")
}

// TestFaultRestartKeepsContestedClusterIP: a ClusterIP held by a Service
// made through the API (it has a creation time) is claimed by a second,
// hand-written Service without one, added to the state directory while
// the proxy runs; the holder keeps it. The proxy is then restarted under
// traffic to that address: every request must still reach the holder's
// endpoint (pod-a), never the claimant's (pod-b), and the kernel must
// equal what render prints.
func TestFaultRestartKeepsContestedClusterIP(t *testing.T) {
	t.Parallel()
	const contested = "10.96.2.60"
	holder := strings.Replace(service{namespace: "default", name: "zz-holder", clusterIP: netip.MustParseAddr(contested),
		portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		"  namespace: default\n", "  namespace: default\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n", 1)
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{
		"contest-holder.yaml": documents(holder,
			endpointSlice{namespace: "default", name: "zz-holder-ipv4", service: "zz-holder", portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{podA}}.yaml()),
	}})
	addr := hostPort(contested, "80")
	e.waitTraffic(t, time.Now(), 10*time.Second, addr, podA.Name)

	logged := len(e.proxy.log.lines())
	writeAtomic(t, e.state, "contest-claimant.yaml", documents(
		service{namespace: "default", name: "aa-claimant", clusterIP: netip.MustParseAddr(contested),
			portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		endpointSlice{namespace: "default", name: "aa-claimant-ipv4", service: "aa-claimant", portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{podB}}.yaml()))
	e.proxy.waitLog(t, 10*time.Second, "the conflict reported", func(lines []string) bool {
		return warned(lines[logged:], "aa-claimant", "conflicts with the cluster IP of service default/zz-holder")
	})
	f := e.startFlows(t, addr, hostPort(dnsClusterIP, dnsPort))
	e.waitTraffic(t, time.Now(), 5*time.Second, addr, podA.Name)

	e.proxy.stop(t)
	t0 := time.Now()
	e.proxy = startProxy(t, e.sb, e.state)
	restarted := time.Since(t0)
	if err := e.probe(t.Context(), addr, 16, podA.Name); err != nil {
		t.Errorf("after the restart, %s: %v", addr, err)
	}
	e.waitRendered(t, 10*time.Second, "after the restart")
	res := f.stop(t)
	if got := sortedKeys(res.tcp.Backend); !slices.Equal(got, []string{podA.Name}) {
		t.Errorf("the flow to %s was answered by %v, want only %s (the holder's endpoint)", addr, got, podA.Name)
	}
	logFault(t, "a ClusterIP claimed by a second, hand-written Service, then the proxy restarted (first sync after "+restarted.Round(time.Millisecond).String()+"): every request reached the holder", -1, res)
	res.expectNoFailures(t, "restart with a contested ClusterIP")
}
