package ipvsnl_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// What upstream kube-proxy's IPVS mode leaves behind, made the way it
// makes it (a dummy kube-ipvs0 holding the VIPs, virtual servers on them
// and NodePort ones on a node address), plus someone else's virtual
// server: DeleteDummyAndServers removes kube-ipvs0 and only the virtual
// servers on its addresses. Real IPVS: the VM tier.
func TestKernelUpstreamLeftovers(t *testing.T) {
	vmguest.RequireIPVS(t)
	ns := testns.New(t, "knp-ipvsleft-")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return string(out)
	}
	run("ip", "link", "add", "kube-ipvs0", "type", "dummy")
	run("ip", "link", "add", "eth0", "type", "dummy")
	run("ip", "link", "set", "eth0", "up")
	run("ip", "addr", "add", "192.168.7.2/24", "dev", "eth0")
	for _, vip := range []string{"10.96.0.1", "10.96.0.10", "203.0.113.9"} {
		run("ip", "addr", "add", vip+"/32", "dev", "kube-ipvs0")
	}
	// kube-proxy's: ClusterIPs, an LB IP, a NodePort on the node address.
	for _, vs := range []struct{ proto, addr string }{
		{"-t", "10.96.0.1:443"}, {"-t", "10.96.0.10:53"}, {"-u", "10.96.0.10:53"},
		{"-t", "203.0.113.9:80"}, {"-t", "192.168.7.2:30080"},
	} {
		run("ipvsadm", "-A", vs.proto, vs.addr, "-s", "rr")
		run("ipvsadm", "-a", vs.proto, vs.addr, "-r", "10.244.0.5", "-m", "-w", "1")
	}
	// Someone else's, on an address that is not on kube-ipvs0.
	run("ipvsadm", "-A", "-t", "192.168.7.2:8443", "-s", "wrr")

	c := ipvsnltest.Dial(t, "/run/netns/"+ns)
	servers, link, err := ipvsnl.DeleteDummyAndServers("/run/netns/"+ns, c)
	if err != nil {
		t.Fatal(err)
	}
	if servers != 4 || !link {
		t.Errorf("removed %d virtual servers and link=%v, want the 4 on kube-ipvs0 and the link", servers, link)
	}
	vss, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, v := range vss {
		left = append(left, v.ServiceKey.String())
	}
	want := []string{"tcp/192.168.7.2:8443", "tcp/192.168.7.2:30080"} // in ServiceKey order
	if strings.Join(left, " ") != strings.Join(want, " ") {
		// A NodePort's virtual server is on a node address, where nothing
		// tells kube-proxy's from someone else's (upstream's cleanup flushes
		// all of IPVS); it is harmless once our rules DNAT NodePorts before
		// IPVS's hooks see them.
		t.Errorf("virtual servers left: %v, want %v", left, want)
	}
	if _, exists, err := ipvsnl.DummyAddrs(testns.Path(ns)); err != nil || exists {
		t.Errorf("kube-ipvs0 still there (exists=%v, err=%v)", exists, err)
	}
	// The node's own address is untouched.
	if out := run("ip", "-br", "addr", "show", "eth0"); !strings.Contains(out, "192.168.7.2/24") {
		t.Errorf("eth0 lost its address: %s", out)
	}
	// Nothing left to do: a second run is a no-op.
	servers, link, err = ipvsnl.DeleteDummyAndServers("/run/netns/"+ns, c)
	if err != nil || servers != 0 || link {
		t.Errorf("second run: %d servers, link=%v, err=%v", servers, link, err)
	}
}
