package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// What a proxy that finds another one running says, and what one that
// waits for it says.
var (
	otherInstanceRE = regexp.MustCompile(`(?i)(another|other|second|already|concurrent)\b.*\b(instance|kube-nftproxy|proxy|running|lock)|\block(ed)?\b`)
	waitingRE       = regexp.MustCompile(`(?i)\bwait(s|ing)?\b`)
)

// TestFaultTwoInstances starts a second proxy in the node namespace of a
// running one (other health and metrics ports, so that those do not stop
// it): it must say that another instance is running and exit non-zero, or
// wait without touching the tables, rather than both rewriting them. The
// first one's Services must not notice.
func TestFaultTwoInstances(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	f := e.startExampleFlows(t)
	second := e.launchSecondProxy(t)

	// Judged within a deadline: exited, synced, or waiting.
	const watch = 10 * time.Second
	deadline := time.Now().Add(watch)
	err := sandbox.Poll(t.Context(), watch+5*time.Second, 20*time.Millisecond, func(context.Context) error {
		if second.proc.Exited() || second.syncs() > 0 {
			return nil
		}
		if time.Now().Before(deadline) {
			return errors.New("still running")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := second.log.lines()
	said := slices.ContainsFunc(lines, otherInstanceRE.MatchString)
	switch {
	case second.syncs() > 0:
		t.Errorf("the second instance synced (%d syncs) while the first runs: both rewrite the tables; it must exit or wait, saying another instance runs", second.syncs())
	case second.proc.Exited():
		werr := second.proc.Wait()
		if werr == nil {
			t.Errorf("the second instance exited 0; want a non-zero status")
		}
		if !said {
			t.Errorf("the second instance exited (%v) without saying that another instance runs; its log: %q", werr, lines)
		}
		if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "proxy mode") }) {
			t.Errorf("the refused second instance spoke of its mode first, which it never ran; its log: %q", lines)
		}
		t.Logf("the second instance exited: %v", werr)
	default:
		if !said || !slices.ContainsFunc(lines, waitingRE.MatchString) {
			t.Errorf("after %v the second instance runs without syncing but has not said that it waits for another instance; its log: %q", watch, lines)
		} else {
			t.Logf("the second instance waits, and says so")
		}
	}
	// The first one's rules are as they were, and it still runs.
	e.waitRendered(t, 5*time.Second, "with a second instance started")
	res := f.stop(t)
	logFault(t, "second instance in the same network namespace", -1, res)
	res.expectNoFailures(t, "a second instance started")
	e.proxy.checkRunning(t)
}

// launchSecondProxy starts a second proxy in the node namespace, with other
// health and metrics ports than the env's (so that those do not stop it),
// its log lines prefixed "second proxy: "; its exit is the test's to judge.
func (e *env) launchSecondProxy(t *testing.T) *proxy {
	t.Helper()
	// In iptables mode, whose meaning a proxy that runs logs at start (a
	// refused one must say only why it is refused).
	second := launchProxy(t, e.sb, 10*time.Second, proxyCommand(e.state, "--proxy-mode=iptables",
		"--healthz-bind-address", "127.0.0.1:10266", "--metrics-bind-address", "127.0.0.1:10259")...)
	second.log.mu.Lock()
	second.log.prefix = "second proxy: "
	second.log.mu.Unlock()
	second.exitJudged.Store(true)
	return second
}

// TestFaultLockSquatted: before the proxy starts, a process that cannot run
// one binds the abstract socket that was the start-up lock (uid 65534
// without capabilities), and another (root without CAP_NET_ADMIN) tries to
// create the lock's table first. The proxy must start and serve anyway,
// and a second proxy and --cleanup must still be refused, naming the
// first one's pid.
func TestFaultLockSquatted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	e.proxy.stop(t)
	squatter := e.squat(t)
	// root without CAP_NET_ADMIN cannot take the lock's table first.
	out, err := e.sb.Exec(t.Context(), sandbox.Node, "setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin",
		"nft", "add table ip kube-nftproxy-lock { flags owner; }")
	if err == nil || !strings.Contains(err.Error(), "Operation not permitted") {
		t.Fatalf("root without CAP_NET_ADMIN creating the lock's table: %v, output %q; want Operation not permitted", err, out)
	}
	t0 := time.Now()
	e.proxy = startProxy(t, e.sb, e.state) // fails the test unless it syncs
	started := time.Since(t0)
	e.waitRendered(t, 5*time.Second, "with the abstract socket squatted")
	f := e.startExampleFlows(t)

	second := e.launchSecondProxy(t)
	select {
	case <-second.proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the second proxy still runs after 10s (%d syncs) next to the first", second.syncs())
	}
	lines := second.log.lines()
	naming := fmt.Sprintf("pid %d", e.proxy.proc.Pid())
	if werr := second.proc.Wait(); werr == nil || !slices.ContainsFunc(lines, func(l string) bool {
		return otherInstanceRE.MatchString(l) && strings.Contains(l, naming)
	}) {
		t.Errorf("the second proxy exited (%v) without saying that another instance (%s) runs; its log: %q", werr, naming, lines)
	}
	if second.syncs() > 0 {
		t.Errorf("the second proxy synced %d times", second.syncs())
	}
	// --cleanup takes the same lock: refused while the proxy runs.
	if out, err := e.sb.Exec(t.Context(), sandbox.Node, proxyBin, "--cleanup"); err == nil || !strings.Contains(err.Error(), naming) {
		t.Errorf("--cleanup while the proxy runs: %v, output %q; want a refusal naming %s", err, out, naming)
	}
	e.waitRendered(t, 5*time.Second, "after the second proxy and --cleanup were refused")
	res := f.stop(t)
	if squatter.Exited() {
		t.Errorf("the squatter (pid %d) exited: the proxy was not shown to start beside it", squatter.Pid())
	}
	logFault(t, "@kube-nftproxy bound first by uid 65534, the lock table tried first by root without CAP_NET_ADMIN; "+
		"the proxy starts (recovery: to its first sync); a second instance and --cleanup refused", started, res)
	res.expectNoFailures(t, "a squatted abstract socket, then a second instance")
	e.proxy.checkRunning(t)
}

// squat starts, in the node namespace, an e2e-agent as uid 65534 without
// capabilities holding the abstract socket @kube-nftproxy, and returns
// it once it says so.
func (e *env) squat(t *testing.T) *sandbox.Process {
	t.Helper()
	bin := runnableByAnyone(t, agentBin)
	cmd := e.sb.Command(context.Background(), sandbox.Node, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", bin, "squat", "@kube-nftproxy")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	p, err := e.sb.StartCmd(sandbox.Node, cmd)
	if err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		said <- strings.TrimSpace(line)
	}()
	select {
	case line := <-said:
		if want := "squatting @kube-nftproxy uid=65534"; line != want {
			t.Fatalf("the squatter said %q, want %q", line, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the squatter said nothing within 10s")
	}
	return p
}

// runnableByAnyone copies the executable at path into a directory every
// uid can reach (the test's build directories are root's only).
func runnableByAnyone(t *testing.T, path string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "knp-anyone-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFaultStartupErrors runs the proxy with a --state that does not exist
// and with kubeconfigs that cannot be used: each must exit non-zero soon,
// with a message naming the path. Each runs in a network namespace of its
// own that goes away with it (unshare --net), so that a proxy that does
// not exit touches nothing.
func TestFaultStartupErrors(t *testing.T) {
	t.Parallel()
	needRoot(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.kubeconfig")
	if err := os.WriteFile(garbage, []byte("\x00\x01 this is: [no kubeconfig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	isDir := filepath.Join(dir, "dir.kubeconfig")
	if err := os.Mkdir(isDir, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name, path string
		args       []string
	}{
		{"--state that does not exist", missing, []string{"--state", missing}},
		{"--kubeconfig that does not exist", missing + ".kubeconfig", []string{"--kubeconfig", missing + ".kubeconfig"}},
		{"--kubeconfig that is a directory", isDir, []string{"--kubeconfig", isDir}},
		{"--kubeconfig that is garbage", garbage, []string{"--kubeconfig", garbage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			args := append([]string{"--net", proxyBin, "--proxy-mode=nftables", "--hostname-override", nodeName, "--cluster-cidr", clusterCIDRs()}, tc.args...)
			cmd := exec.CommandContext(ctx, "unshare", args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			t0 := time.Now()
			err := cmd.Run()
			took := time.Since(t0)
			t.Logf("exit after %v: %v; output:\n%s", took.Round(time.Millisecond), err, out.Bytes())
			var ee *exec.ExitError
			switch {
			case ctx.Err() != nil:
				t.Fatalf("the proxy did not exit within 20s (killed); it must exit non-zero at once")
			case err == nil:
				t.Errorf("the proxy exited 0; want a non-zero status")
			case !errors.As(err, &ee) || ee.ExitCode() <= 0:
				t.Errorf("the proxy ended with %v; want a non-zero exit status", err)
			}
			if !strings.Contains(out.String(), tc.path) {
				t.Errorf("the proxy's message does not name %s", tc.path)
			}
			if took > 10*time.Second {
				t.Errorf("the proxy took %v to give up; want it at once", took)
			}
		})
	}
}

// stoppingRE is what a proxy says when it stops on a signal.
var stoppingRE = regexp.MustCompile(`(?i)\b(stopping|shutting down|exiting|terminating)\b`)

// TestFaultSIGTERM stops the proxy with SIGTERM: it must log that it is
// stopping and exit 0, and leave its rules in place, as kube-proxy does,
// so that Services keep working until the next proxy starts.
func TestFaultSIGTERM(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	f := e.startExampleFlows(t)
	before := len(e.proxy.log.lines())
	if err := e.proxy.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.proxy.proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not exit within 10s of SIGTERM")
	}
	if err := e.proxy.proc.Wait(); err != nil {
		t.Errorf("the proxy on SIGTERM: %v; want exit status 0", err)
	}
	if lines := e.proxy.log.lines()[before:]; !slices.ContainsFunc(lines, stoppingRE.MatchString) {
		t.Errorf("the proxy did not log that it is stopping; after SIGTERM it logged %q", lines)
	}
	for _, want := range []string{"table ip kube-nftproxy", "table ip6 kube-nftproxy"} {
		if !slices.Contains(nftTables(t, e.sb), want) {
			t.Errorf("after SIGTERM the node has no %s", want)
		}
	}
	for _, c := range []struct{ proto, addr string }{
		{"tcp", hostPort(webClusterIPv4, webPort)},
		{"udp", hostPort(dnsClusterIP, dnsPort)},
	} {
		sum := e.requests(t, podC.Name, c.proto, c.addr, requestsPerCheck)
		expectBackends(t, fmt.Sprintf("after the proxy stopped: %s to %s", c.proto, c.addr), sum, podA.Name, podB.Name)
	}
	res := f.stop(t)
	logFault(t, "SIGTERM (proxy stopped, rules left)", -1, res)
	res.expectNoFailures(t, "SIGTERM")
}
