//go:build linux

package conntrack

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// tuningNetns creates a network namespace of its own and deletes it after
// the test.
func tuningNetns(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kernel test in -short mode")
	}
	return testns.New(t, "knp-sysctl-")
}

// tuningReadIn reads key with a fresh process inside the namespace.
func tuningReadIn(t *testing.T, ns, key string) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", filepath.Join(sysctl.DefaultRoot, key)).CombinedOutput()
	if err != nil {
		t.Fatalf("reading %s in %s: %v: %s", key, ns, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("%s in %s: %v", key, ns, err)
	}
	return n
}

// tuningInNetns runs fn on an OS thread that has entered ns, after checking
// that it did: a tuner must never run in the host's namespace here. The
// thread is not unlocked, so it ends with the goroutine.
func tuningInNetns(t *testing.T, ns string, fn func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		done <- func() error {
			f, err := os.Open("/run/netns/" + ns)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			var want, got unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &want); err != nil {
				return err
			}
			if err := unix.Stat("/proc/thread-self/ns/net", &got); err != nil {
				return err
			}
			if want.Ino != got.Ino || want.Dev != got.Dev {
				return errors.New("this thread is not in the namespace after setns")
			}
			fn()
			return nil
		}()
	}()
	if err := <-done; err != nil {
		t.Fatalf("entering %s: %v", ns, err)
	}
}

// TestTuningKernel applies the tuning in a network namespace of the test's
// own: the per-namespace keys change there and only there; nf_conntrack_max,
// which the kernel makes read-only outside the initial namespace, gives one
// warning and no error. The hash size is a file in a temporary directory:
// the test never writes /sys/module, nor a key of the host's namespace.
func TestTuningKernel(t *testing.T) {
	ns := tuningNetns(t)
	perNetns := []string{keyTCPEstablished, keyTCPCloseWait, keyUDPTimeout, keyUDPStream, keyTCPBeLiberal}
	keys := append([]string{keyMax}, perNetns...)

	// The conntrack keys exist in a namespace once nf_conntrack is loaded;
	// where it is a module not yet in use, a rule using ct loads it.
	present := func() error {
		out, err := exec.Command("ip", "netns", "exec", ns, "test", "-e", filepath.Join(sysctl.DefaultRoot, keyTCPEstablished)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	}
	if err := present(); err != nil {
		if _, lerr := exec.LookPath("nft"); lerr != nil {
			t.Skipf("skipping: no conntrack sysctls in a new network namespace (%v), and no nft to load nf_conntrack with a rule", err)
		}
		nft := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		nft.Stdin = strings.NewReader("table ip t { chain c { type filter hook output priority 0; ct state new accept; }; }\n")
		out, nerr := nft.CombinedOutput()
		t.Logf("no conntrack sysctls yet (%v); an nft rule using ct: %v %s", err, nerr, out)
		if err := present(); err != nil {
			t.Skipf("skipping: no conntrack sysctls in a network namespace (nf_conntrack not available): %v", err)
		}
	}

	host := map[string]int{}
	for _, k := range keys {
		n, err := sysctl.New("").GetInt(k)
		if err != nil {
			t.Fatal(err)
		}
		host[k] = n
	}
	before := map[string]int{}
	for _, k := range keys {
		before[k] = tuningReadIn(t, ns, k)
	}
	t.Logf("host: %v; new namespace: %v", host, before)

	// Values that neither the host nor a fresh namespace has.
	pick := func(k string, candidates ...int) int {
		for _, c := range candidates {
			if c != host[k] && c != before[k] {
				return c
			}
		}
		t.Fatalf("no value to pick for %s", k)
		return 0
	}
	established := pick(keyTCPEstablished, 12345, 12346)
	closeWait := pick(keyTCPCloseWait, 1234, 1235)
	udp := pick(keyUDPTimeout, 37, 38)
	udpStream := pick(keyUDPStream, 157, 158)
	if host[keyTCPBeLiberal] != 0 || before[keyTCPBeLiberal] != 0 {
		t.Fatalf("nf_conntrack_tcp_be_liberal is already 1 (host %d, namespace %d): the test could not see it change", host[keyTCPBeLiberal], before[keyTCPBeLiberal])
	}
	// More than nf_conntrack_max now, so the tuner must try to raise it.
	wantMax := before[keyMax] + 4
	cfg := TuningConfig{
		MaxPerCore:            1,
		Min:                   int32(wantMax),
		TCPEstablishedTimeout: time.Duration(established) * time.Second,
		TCPCloseWaitTimeout:   time.Duration(closeWait) * time.Second,
		TCPBeLiberal:          true,
		UDPTimeout:            time.Duration(udp) * time.Second,
		UDPStreamTimeout:      time.Duration(udpStream) * time.Second,
	}

	// The hash size: a fake, large enough that it is not written.
	module := t.TempDir()
	hs := filepath.Join(module, sysctl.ConntrackHashsize)
	if err := os.MkdirAll(filepath.Dir(hs), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hs, []byte(strconv.Itoa(wantMax)), 0o600); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	var skipped []error
	var applyErr error
	tuningInNetns(t, ns, func() {
		tn := &Tuner{
			Sysctl: sysctl.New(sysctl.DefaultRoot),
			Module: sysctl.New(module),
			NumCPU: func() int { return 2 },
			Log:    slog.New(slog.NewTextHandler(&logs, nil)),
		}
		skipped, applyErr = tn.Apply(cfg)
	})
	t.Logf("tuner log:\n%s", logs.String())
	if applyErr != nil {
		t.Fatalf("Apply: %v", applyErr)
	}

	// In the namespace: changed, as a fresh process reads them.
	want := map[string]int{
		keyTCPEstablished: established, keyTCPCloseWait: closeWait,
		keyUDPTimeout: udp, keyUDPStream: udpStream, keyTCPBeLiberal: 1,
		keyMax: before[keyMax], // read-only there
	}
	for _, k := range keys {
		if got := tuningReadIn(t, ns, k); got != want[k] {
			t.Errorf("%s in the namespace = %d, want %d", k, got, want[k])
		}
	}
	// On the host: unchanged.
	for _, k := range keys {
		if got, err := sysctl.New("").GetInt(k); err != nil || got != host[k] {
			t.Errorf("%s on the host = %d, %v; want %d unchanged", k, got, err, host[k])
		}
	}
	// nf_conntrack_max: one warning, read-only, no error.
	if len(skipped) != 1 || !errors.Is(skipped[0], sysctl.ErrReadOnly) || !strings.Contains(skipped[0].Error(), "nf_conntrack_max") {
		t.Errorf("skipped %v, want one read-only error for nf_conntrack_max", skipped)
	}
	warnings := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") {
			warnings++
			if !strings.Contains(l, "key="+filepath.Join(sysctl.DefaultRoot, keyMax)) || !strings.Contains(l, "read-only") {
				t.Errorf("warning %q: want it to name nf_conntrack_max and say read-only", l)
			}
		}
	}
	if warnings != 1 {
		t.Errorf("%d warnings, want 1 (for nf_conntrack_max)", warnings)
	}
	if b, _ := os.ReadFile(hs); string(b) != strconv.Itoa(wantMax) {
		t.Errorf("the fake hashsize was written: %q", b)
	}

	// Again: nothing left to write, the same single warning.
	logs.Reset()
	tuningInNetns(t, ns, func() {
		tn := &Tuner{Sysctl: sysctl.New(""), Module: sysctl.New(module), NumCPU: func() int { return 2 },
			Log: slog.New(slog.NewTextHandler(&logs, nil))}
		skipped, applyErr = tn.Apply(cfg)
	})
	if applyErr != nil || len(skipped) != 1 || strings.Contains(logs.String(), "conntrack tuning: set") {
		t.Errorf("second Apply: %v, skipped %v, log:\n%s", applyErr, skipped, logs.String())
	}
}
