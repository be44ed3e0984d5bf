package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// mainEnv makes the test binary run kube-nftproxy's main instead of the
// tests: the VM tests start the real command as a process of its own.
const mainEnv = "KNP_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	if mode := os.Getenv(echoEnv); mode != "" {
		os.Exit(runEcho(mode))
	}
	os.Exit(m.Run())
}

// TestVMIPVSMode runs the command in standalone mode with --proxy-mode
// ipvs in a network namespace of a kernel with IPVS (the VM tier; skipped
// elsewhere): virtual servers, kube-ipvs0's addresses, the helper table,
// the sysctls and timeouts appear; SIGTERM leaves them; --cleanup removes
// them all.
func TestVMIPVSMode(t *testing.T) {
	vmguest.RequireIPVS(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	ns := "knp-mode-" + hex.EncodeToString(suffix)
	sh := func(name string, args ...string) (string, error) {
		out, err := exec.Command(name, args...).CombinedOutput()
		return string(out), err
	}
	must := func(name string, args ...string) string {
		t.Helper()
		out, err := sh(name, args...)
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return out
	}
	in := func(args ...string) (string, error) {
		return sh("ip", append([]string{"netns", "exec", ns}, args...)...)
	}
	must("ip", "netns", "add", ns)
	t.Cleanup(func() { _, _ = sh("ip", "netns", "del", ns) })
	must("ip", "-n", ns, "link", "set", "lo", "up")
	must("ip", "-n", ns, "link", "add", "eth0", "type", "dummy")
	must("ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", "eth0")
	must("ip", "-n", ns, "link", "set", "eth0", "up")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	proxy := exec.Command("ip", "netns", "exec", ns, self, "--proxy-mode", "ipvs", "--state", "testdata/ipvs-state",
		"--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16", "--healthz-bind-address", "", "--metrics-bind-address", "",
		"--ipvs-tcp-timeout", "900s", "--ipvs-udp-timeout", "200s", "--ipvs-strict-arp")
	proxy.Env = append(os.Environ(), mainEnv+"=1")
	var logs bytes.Buffer
	proxy.Stdout, proxy.Stderr = &logs, &logs
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proxy.Wait() }()
	defer func() {
		_ = proxy.Process.Kill()
		t.Logf("proxy output:\n%s", logs.String())
	}()

	want := []string{
		"-A -t 10.96.0.10:80 -s rr",
		"-a -t 10.96.0.10:80 -r 10.244.0.10:8080 -m -w 1",
		"-A -u 10.96.0.53:53 -s rr",
		"-A -t 10.99.0.1:30080 -s rr",
	}
	deadline := time.Now().Add(30 * time.Second)
	var rules string
	for {
		rules, _ = in("ipvsadm", "-Sn")
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(rules, w)
		}
		if ok {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the proxy exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			_ = proxy.Process.Signal(syscall.SIGQUIT) // its goroutines to the log
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
			}
			t.Fatalf("virtual servers not programmed; ipvsadm -Sn:\n%s", rules)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if strings.Contains(rules, "127.0.0.1:") {
		t.Errorf("a NodePort on loopback:\n%s", rules)
	}
	if out, _ := in("ip", "addr", "show", "dev", "kube-ipvs0"); !strings.Contains(out, "10.96.0.10/32") || !strings.Contains(out, "10.96.0.53/32") {
		t.Errorf("kube-ipvs0:\n%s", out)
	}
	if out, err := in("nft", "list", "table", "ip", "kube-nftproxy-ipvs"); err != nil || !strings.Contains(out, "10.96.0.10 . tcp . 80") {
		t.Errorf("helper table: %v\n%s", err, out)
	}
	for key, v := range map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
		"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1", "net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2"} {
		if out, _ := in("cat", "/proc/sys/"+key); strings.TrimSpace(out) != v {
			t.Errorf("%s = %q, want %s", key, strings.TrimSpace(out), v)
		}
	}
	if out, _ := in("ipvsadm", "-L", "--timeout"); !strings.Contains(out, "900") || !strings.Contains(out, "200") {
		t.Errorf("timeouts: %s", out)
	}

	_ = proxy.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("proxy on SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("proxy did not stop on SIGTERM")
	}
	if rules, _ := in("ipvsadm", "-Sn"); !strings.Contains(rules, want[0]) {
		t.Errorf("virtual servers gone after SIGTERM:\n%s", rules)
	}

	cl := exec.Command("ip", "netns", "exec", ns, self, "--cleanup")
	cl.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cl.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "IPVS mode") {
		t.Fatalf("--cleanup: %v: %s", err, out)
	}
	if rules, _ := in("ipvsadm", "-Sn"); strings.TrimSpace(rules) != "" {
		t.Errorf("virtual servers after --cleanup:\n%s", rules)
	}
	if out, err := in("ip", "link", "show", "kube-ipvs0"); err == nil {
		t.Errorf("kube-ipvs0 after --cleanup:\n%s", out)
	}
	if out, err := in("nft", "list", "tables"); err != nil || strings.Contains(out, "kube-nftproxy") {
		t.Errorf("tables after --cleanup: %v\n%s", err, out)
	}
}
