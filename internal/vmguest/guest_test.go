package vmguest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The VM guest offers what the IPVS and kernel tests rely on: IPVS with
// every scheduler upstream kube-proxy accepts, in every new network
// namespace; dummy links; nft and ipvsadm that print protocol names. Outside
// the guest this test skips.
func TestGuestKernel(t *testing.T) {
	if !InGuest() {
		t.Skipf("not in the VM tier's guest ($%s unset); run: hack/vm/run.sh ./internal/vmguest", Env)
	}
	RequireIPVS(t)

	mods, err := os.ReadFile("/proc/modules")
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[string]bool{}
	for _, l := range strings.Split(string(mods), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			loaded[f[0]] = true
		}
	}
	for _, m := range []string{
		"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_lblc", "ip_vs_lblcr",
		"ip_vs_dh", "ip_vs_sh", "ip_vs_sed", "ip_vs_nq", "ip_vs_mh",
		"dummy", "veth", "bridge", "br_netfilter", "nf_tables", "nf_conntrack",
		"nf_conntrack_netlink", "nf_nat", "nft_chain_nat", "nft_ct", "nft_numgen", "nft_fib_inet",
	} {
		if !loaded[m] {
			t.Errorf("module %s is not loaded", m)
		}
	}

	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	ns := "knp-vm-" + hex.EncodeToString(suffix)
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })

	// IPVS state is per network namespace: a new one has its own table.
	if out := run(t, "ip", "netns", "exec", ns, "cat", IPVSProc); !strings.Contains(out, "IP Virtual Server") {
		t.Errorf("%s in a new netns: %q", IPVSProc, out)
	}
	run(t, "ip", "-n", ns, "link", "add", "kube-ipvs0", "type", "dummy")
	run(t, "ip", "-n", ns, "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0")
	// One virtual server per scheduler, in one ipvsadm run (a process
	// costs a good fraction of a second under TCG).
	scheds := []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"}
	var rules strings.Builder
	for i, sched := range scheds {
		fmt.Fprintf(&rules, "-A -t 10.96.0.10:%d -s %s\n-a -t 10.96.0.10:%d -r 10.244.0.2:8080 -m\n", 80+i, sched, 80+i)
	}
	restore := exec.Command("ip", "netns", "exec", ns, "ipvsadm", "-R")
	restore.Stdin = strings.NewReader(rules.String())
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("ipvsadm -R: %v: %s", err, out)
	}
	out := run(t, "ip", "netns", "exec", ns, "ipvsadm", "-Ln")
	for i, sched := range scheds {
		if !strings.Contains(out, fmt.Sprintf("10.96.0.10:%d %s", 80+i, sched)) {
			t.Errorf("no virtual server with scheduler %s in ipvsadm -Ln:\n%s", sched, out)
		}
	}

	run(t, "ip", "netns", "exec", ns, "nft", "add table ip t; add chain ip t c { type nat hook prerouting priority dstnat; }; add rule ip t c tcp dport 80 dnat to 10.244.0.2")
	if out := run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset"); !strings.Contains(out, "tcp dport 80 dnat to 10.244.0.2") {
		t.Errorf("nft list ruleset (is /etc/protocols there?):\n%s", out)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
