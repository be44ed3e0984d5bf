package conntrack

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// testNetns creates a network namespace with lo up and DNAT rules sending
// UDP to 10.96.0.10:53 on to 127.0.0.1:5353 (and fd00::a to [::1]:5353),
// and deletes it after the test.
func testNetns(t testing.TB) string {
	t.Helper()
	name := testns.New(t, "knp-ct-")
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	run(t, "ip", "-n", name, "route", "add", "10.96.0.0/16", "dev", "lo", "src", "127.0.0.1")
	run(t, "ip", "-n", name, "-6", "route", "add", "fd00::/64", "dev", "lo", "src", "::1")
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary (package nftables) to set up the test's DNAT rule")
	}
	nft := exec.Command("ip", "netns", "exec", name, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(`table ip t {
	chain out {
		type nat hook output priority -100
		ip daddr 10.96.0.10 udp dport 53 dnat to 127.0.0.1:5353
		ip daddr 10.96.0.12 udp dport 53 dnat to 127.0.0.1:5354
	}
}
table ip6 t {
	chain out {
		type nat hook output priority -100
		ip6 daddr fd00::a udp dport 53 dnat to [::1]:5353
	}
}
`)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	return name
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// inNetns runs fn on a thread inside the namespace; sockets it opens stay
// there.
func inNetns(t testing.TB, ns string, fn func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // the thread dies with the goroutine: never back in the pool
		f, err := os.Open("/run/netns/" + ns)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			fn()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("entering %s: %v", ns, err)
	}
}

// sendUDP sends one datagram from each of the n source ports from
// firstPort on to dst, which makes n conntrack entries.
func sendUDP(t testing.TB, ns string, dst netip.AddrPort, firstPort, n int) {
	t.Helper()
	inNetns(t, ns, func() {
		for i := 0; i < n; i++ {
			src := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: firstPort + i}
			network := "udp4"
			if dst.Addr().Is6() {
				src.IP, network = net.IPv6loopback, "udp6"
			}
			c, err := net.DialUDP(network, src, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				t.Errorf("dial %v: %v", dst, err)
				return
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
	})
}

func dialIn(t testing.TB, ns string) *Conn {
	t.Helper()
	c, err := Dial("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestKernelListAndDelete(t *testing.T) {
	ns := testNetns(t)
	svc := netip.MustParseAddrPort("10.96.0.10:53")
	plain := netip.MustParseAddrPort("127.0.0.1:9999")
	sendUDP(t, ns, svc, 20000, 5)
	sendUDP(t, ns, plain, 20000, 3)
	c := dialIn(t, ns)

	flows, err := c.List(unix.AF_INET, protoUDP)
	if err != nil {
		t.Fatal(err)
	}
	if c.noFilter {
		t.Errorf("this kernel (5.8+) should filter the dump by protocol")
	}
	var dnat, other []Flow
	for _, f := range flows {
		switch {
		case f.OrigDst == svc:
			if !f.DNATed() || f.ReplySrc != netip.MustParseAddrPort("127.0.0.1:5353") {
				t.Errorf("flow to the service should be DNATed to 127.0.0.1:5353: %+v", f)
			}
			if f.ID == 0 || !f.OrigSrc.Addr().IsLoopback() {
				t.Errorf("flow lacks its id or source: %+v", f)
			}
			dnat = append(dnat, f)
		case f.OrigDst == plain:
			if f.DNATed() {
				t.Errorf("flow to %v was not DNATed: %+v", plain, f)
			}
			other = append(other, f)
		}
	}
	if len(dnat) != 5 || len(other) != 3 {
		t.Fatalf("want 5 DNATed and 3 plain flows, got %d and %d of %v", len(dnat), len(other), flows)
	}
	if tcp, err := c.List(unix.AF_INET, 6); err != nil || len(tcp) != 0 || c.lastRead != 0 {
		t.Errorf("TCP listing: %v, %v, %d entries read (want none: the kernel filters)", tcp, err, c.lastRead)
	}

	n, err := c.Delete(dnat)
	if err != nil || n != 5 {
		t.Fatalf("Delete: %d, %v; want 5", n, err)
	}
	after, err := c.List(unix.AF_INET, protoUDP)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range after {
		if f.OrigDst == svc {
			t.Errorf("deleted flow still there: %+v", f)
		}
	}
	if len(after) != len(flows)-5 {
		t.Errorf("%d flows left, want %d", len(after), len(flows)-5)
	}
	// Deleting them again is not an error: they are already gone.
	if n, err := c.Delete(dnat); err != nil || n != 0 {
		t.Errorf("second Delete: %d, %v; want 0, nil", n, err)
	}
	// An id that does not match leaves the entry alone.
	wrong := other[0]
	wrong.ID++
	if n, err := c.Delete([]Flow{wrong}); err != nil || n != 0 {
		t.Errorf("Delete with a wrong id: %d, %v; want 0, nil", n, err)
	}
}

// IPv6 entries are listed and deleted the same way.
func TestKernelListAndDeleteIPv6(t *testing.T) {
	ns := testNetns(t)
	svc := netip.MustParseAddrPort("[fd00::a]:53")
	sendUDP(t, ns, svc, 20000, 4)
	sendUDP(t, ns, netip.MustParseAddrPort("10.96.0.10:53"), 20000, 2)
	c := dialIn(t, ns)
	flows, err := c.List(unix.AF_INET6, protoUDP)
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 4 {
		t.Fatalf("want the 4 IPv6 flows only, got %v", flows)
	}
	for _, f := range flows {
		if f.OrigDst != svc || f.ReplySrc != netip.MustParseAddrPort("[::1]:5353") || !f.OrigSrc.Addr().Is6() {
			t.Errorf("unexpected flow %+v", f)
		}
	}
	if n, err := c.Delete(flows[:3]); err != nil || n != 3 {
		t.Fatalf("Delete: %d, %v; want 3", n, err)
	}
	if left, err := c.List(unix.AF_INET6, protoUDP); err != nil || len(left) != 1 || left[0] != flows[3] {
		t.Errorf("left %v, %v; want only %+v", left, err, flows[3])
	}
	if v4, err := c.List(unix.AF_INET, protoUDP); err != nil || len(v4) != 2 {
		t.Errorf("IPv4 flows %v, %v; want the 2, untouched", v4, err)
	}
}
