package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// badServiceYAML is a Service the state loader skips with a warning.
const badServiceYAML = `apiVersion: v1
kind: Service
metadata: {name: bad, namespace: default}
spec:
  clusterIP: 10.96.0.300
  clusterIPs: [10.96.0.300]
  ports: [{name: http, protocol: TCP, port: 80}]
`

// runMain runs kube-nftproxy's main as a process of its own (this test
// binary, see TestMain) with args, and returns its stdout and stderr.
func runMain(t *testing.T, wrapper []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	argv := append(append(slices.Clone(wrapper), os.Args[0]), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// The real process's output: results on stdout as ever, every log line on
// stderr (or, split, info on stdout) in the chosen format, naming our
// source line.
func TestLoggingProcess(t *testing.T) {
	state := t.TempDir()
	for _, f := range []string{"services.yaml", "endpointslices.yaml", "node.yaml"} {
		data, err := os.ReadFile(filepath.Join("../../examples/demo", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(state, "bad.yaml"), []byte(badServiceYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		format string
		// logs: the messages logged to each stream, their callers' files
		stdoutLogs, stderrLogs []string
		stdoutHas              string // what else stdout has
	}{
		{name: "render, text", args: []string{"render", "--state", state, "--hostname-override", "node-1"}, format: "text",
			stderrLogs: []string{"W commands.go bad input"}, stdoutHas: "table ip kube-nftproxy {"},
		{name: "render, json", args: []string{"render", "--state", state, "--hostname-override", "node-1", "--logging-format=json"}, format: "json",
			stderrLogs: []string{"I commands.go bad input"}, stdoutHas: "table ip kube-nftproxy {"},
		{name: "proxy, text", args: []string{"--proxy-mode=nftables", "--write-config-to", os.DevNull, "--feature-gates=LoggingBetaOptions=true"}, format: "text",
			stderrLogs: []string{"I complete.go feature gates"}},
		{name: "proxy, text split", args: []string{"--proxy-mode=nftables", "--write-config-to", os.DevNull, "--feature-gates=LoggingAlphaOptions=true", "--log-text-split-stream"}, format: "text",
			stdoutLogs: []string{"I complete.go feature gates"}},
		{name: "proxy, json", args: []string{"--proxy-mode=nftables", "--write-config-to", os.DevNull, "--feature-gates=LoggingBetaOptions=true", "--logging-format", "json"}, format: "json",
			stderrLogs: []string{"I complete.go feature gates"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := runMain(t, nil, tt.args...)
			if err != nil {
				t.Fatalf("%v: %v\n%s", tt.args, err, stderr)
			}
			if !strings.Contains(stdout, tt.stdoutHas) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdoutHas, stdout)
			}
			if tt.stdoutHas != "" {
				stdout = "" // results, not logs
			}
			for _, s := range []struct {
				name string
				out  string
				want []string
			}{{"stdout", stdout, tt.stdoutLogs}, {"stderr", stderr, tt.stderrLogs}} {
				var got []string
				for _, l := range parseLogLines(t, tt.format, s.out) {
					got = append(got, l.severity+" "+strings.Split(l.caller, ":")[0]+" "+l.msg)
				}
				if !slices.Equal(got, s.want) {
					t.Errorf("%s logs %q, want %q:\n%s", s.name, got, s.want, s.out)
				}
			}
		})
	}
}

// client-go's own lines come out in JSON like ours: here the warning an
// API server sends in a Warning header, which client-go logs through klog
// (its default warning handler); every line of the output parses as JSON.
func TestClientGoLogsJSON(t *testing.T) {
	c := logsapi.NewLoggingConfiguration()
	c.Format = "json"
	out := &lockedBuffer{buf: &bytes.Buffer{}}
	resetLogging(t)
	t.Cleanup(func() { resetLogging(t) })
	log, _, err := startLogging(c, nil, out, out)
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("Warning", `299 - "v1 Service list: a warning from the API server"`)
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer api.Close()
	log.Info("ours")
	client := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL})
	if _, err := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	var got []string
	for _, l := range parseLogLines(t, "json", out.String()) {
		got = append(got, strings.Split(l.caller, ":")[0]+" "+l.msg)
	}
	want := []string{"logging_process_test.go ours", "warnings.go Warning: v1 Service list: a warning from the API server"}
	if !slices.Equal(got, want) {
		t.Errorf("logged %q, want %q:\n%s", got, want, out)
	}
}

// The proxy itself, in a network namespace of its own, with an API server
// that is not there: every line it writes, client-go's included, is JSON.
func TestProxyProcessJSON(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the proxy in a new network namespace (unshare -n)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
users: [{name: u, user: {}}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-n", os.Args[0], "--kubeconfig", kubeconfig, "--hostname-override", "n1",
		"--logging-format=json", "-v=4", "--conntrack-max-per-core=0", "--healthz-bind-address=", "--metrics-bind-address=")
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out := &lockedBuffer{buf: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "cannot read the source of Services") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the proxy did not log the API server's failure in 20s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("proxy on SIGTERM: %v\n%s", err, out)
	}
	var msgs []string
	for _, l := range parseLogLines(t, "json", out.String()) {
		msgs = append(msgs, l.msg)
	}
	for _, want := range []string{"kube-nftproxy running; nothing is programmed before the API server's first complete listing", "kube-nftproxy stopping; the rules stay in the kernel"} {
		if !slices.Contains(msgs, want) {
			t.Errorf("no %q in %q", want, msgs)
		}
	}
}

// lockedBuffer is a bytes.Buffer that a process or goroutines write while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The logging flags are kube-proxy's: the same names, types, defaults and
// help as upstream's --help shows them.
func TestLoggingFlagsAsUpstream(t *testing.T) {
	kubeProxy := upstreamKubeProxy(t)
	loggingFlags := func(help string) []string {
		var out []string
		for _, l := range strings.Split(help, "\n") {
			f := strings.Fields(l)
			if len(f) > 0 && (f[0] == "-v," || f[0] == "--vmodule" || strings.HasPrefix(f[0], "--log")) {
				out = append(out, strings.Join(f, " "))
			}
		}
		return out
	}
	want, err := exec.Command(kubeProxy, "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := runMain(t, nil, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if g, w := loggingFlags(got), loggingFlags(string(want)); !slices.Equal(g, w) || len(w) != 8 {
		t.Errorf("logging flags\n%s\nwant upstream's\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}
