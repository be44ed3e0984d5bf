package nftbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
)

// The addresses of one run's namespaces. Runs follow each other and each
// deletes its namespaces (and with them the veth pairs) before the next,
// so every run uses the same ones.
var (
	apiSideAddr = netip.MustParseAddr("10.123.0.1") // the API server's end of the node's veth
	nodeAddr    = netip.MustParseAddr("10.123.0.2") // the node's InternalIP
	nodePodSide = netip.MustParseAddr("10.244.0.1") // the node's end of the pod's veth
	// The pod answers on two addresses: the added Service's endpoint, and
	// where that endpoint then moves.
	podAddrs = [2]netip.Addr{netip.MustParseAddr("10.244.0.10"), netip.MustParseAddr("10.244.0.11")}
)

const (
	clusterCIDR = "10.244.0.0/16"
	serviceCIDR = "10.96.0.0/16" // the IPv4 half of apiserver.DefaultServiceCIDR
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// ipCmd runs `ip args...`.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetNS creates a named network namespace with loopback up; the
// returned function deletes it.
func newNetNS(prefix string) (string, func(), error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if err := ipCmd("netns", "add", name); err != nil {
		return "", nil, err
	}
	del := func() { _ = exec.Command("ip", "netns", "del", name).Run() }
	if err := ipCmd("-n", name, "link", "set", "lo", "up"); err != nil {
		del()
		return "", nil, err
	}
	return name, del, nil
}

// veth joins namespaces a and b: interface aName with aAddrs in a, bName
// with bAddrs in b (CIDR notation), both up.
func veth(a, aName string, aAddrs []string, b, bName string, bAddrs []string) error {
	if err := ipCmd("-n", a, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", b); err != nil {
		return err
	}
	for _, s := range []struct {
		ns, dev string
		addrs   []string
	}{{a, aName, aAddrs}, {b, bName, bAddrs}} {
		for _, addr := range s.addrs {
			if err := ipCmd("-n", s.ns, "addr", "add", addr, "dev", s.dev); err != nil {
				return err
			}
		}
		if err := ipCmd("-n", s.ns, "link", "set", s.dev, "up"); err != nil {
			return err
		}
	}
	return nil
}

// node is one run's fresh node namespace, joined to the API server's, and
// its pod: a namespace with a TCP server on scale.TargetPort that greets
// every connection with the address it was made to.
type node struct {
	ns, podNS string
	server    net.Listener
	cleanups  []func()
}

// newNode builds a node and its pod. Connections from the node to a
// ClusterIP that no rule handles yet go to the pod, which refuses them at
// once (it routes the Service range to itself, with nothing on port 80),
// so a probe of a Service not yet programmed fails in microseconds, not
// after a SYN timeout.
func newNode(apiNS string) (n *node, err error) {
	n = &node{}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	var del func()
	if n.ns, del, err = newNetNS("knp-nb-"); err != nil {
		return nil, err
	}
	n.cleanups = append(n.cleanups, del)
	if n.podNS, del, err = newNetNS("knp-nbpod-"); err != nil {
		return nil, err
	}
	n.cleanups = append(n.cleanups, del)
	apiSide := "nb-" + n.ns[len(n.ns)-6:]
	if err := veth(apiNS, apiSide, []string{apiSideAddr.String() + "/30"},
		n.ns, "api0", []string{nodeAddr.String() + "/30"}); err != nil {
		return nil, err
	}
	// Every node's veth has the same subnet in the API server's
	// namespace. Deleting the node's namespace removes its end there
	// only when the kernel's namespace cleanup gets to it, and until
	// then the API server's answers to the next node can take that dead
	// route: its first connection then waited for a retransmission (a
	// second; one start-up in six). So the pair goes first, at once.
	n.cleanups = append(n.cleanups, func() { _ = ipCmd("-n", apiNS, "link", "del", apiSide) })
	if err := veth(n.ns, "pod0", []string{nodePodSide.String() + "/24"},
		n.podNS, "eth0", []string{podAddrs[0].String() + "/24", podAddrs[1].String() + "/24"}); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", n.ns, "route", "add", serviceCIDR, "via", podAddrs[0].String()},
		{"-n", n.podNS, "route", "add", "default", "via", nodePodSide.String()},
		{"-n", n.podNS, "route", "add", "local", serviceCIDR, "dev", "lo"},
	} {
		if err := ipCmd(args...); err != nil {
			return nil, err
		}
	}
	err = apiserver.RunInNetNS(n.podNS, func() error {
		var err error
		n.server, err = net.Listen("tcp4", ":"+strconv.Itoa(scale.TargetPort))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the pod's server: %w", err)
	}
	go serve(n.server)
	return n, nil
}

// serve greets each connection with the address it was made to.
func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		local := c.LocalAddr().(*net.TCPAddr).IP.String()
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte(local + "\n"))
		_ = c.Close()
	}
}

func (n *node) close() {
	if n.server != nil {
		_ = n.server.Close()
	}
	for i := len(n.cleanups) - 1; i >= 0; i-- {
		n.cleanups[i]()
	}
}

// probe opens one TCP connection from the node to addr and returns the
// backend's greeting (the pod address that answered).
func (n *node) probe(addr netip.AddrPort) (string, error) {
	var c net.Conn
	err := apiserver.RunInNetNS(n.ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", addr.String(), probeTimeout)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

const (
	// probeEvery is how often waitBackend opens a new connection, whether
	// or not the ones before have failed: upstream drops packets to
	// ClusterIPs it has not programmed yet (ours lets them reach the pod,
	// which refuses them), so a SYN sent just before the sync is lost and
	// only a later connection can tell when traffic flows.
	probeEvery   = 2 * time.Millisecond
	probeTimeout = 250 * time.Millisecond
	// maxProbes bounds the connections in flight (each holds a thread
	// locked in the node's namespace while it connects): about
	// probeTimeout/probeEvery when every SYN is dropped.
	maxProbes = 200
)

// waitBackend opens a connection to addr every probeEvery until one is
// answered by backend, and returns the time from t0 to that answer.
func (n *node) waitBackend(ctx context.Context, p *proxyProc, addr netip.AddrPort, backend netip.Addr, t0 time.Time) (time.Duration, error) {
	var (
		inflight atomic.Int32
		last     atomic.Value
		found    = make(chan time.Duration, 1)
		tick     = time.NewTicker(probeEvery)
	)
	defer tick.Stop()
	last.Store("no answer yet")
	for {
		select {
		case d := <-found:
			return d, nil
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s to reach %s (last: %s): %w", addr, backend, last.Load(), ctx.Err())
		case <-tick.C:
		}
		if err := p.exited(); err != nil {
			return 0, err
		}
		if inflight.Load() >= maxProbes {
			continue
		}
		inflight.Add(1)
		go func() {
			defer inflight.Add(-1)
			got, err := n.probe(addr)
			switch {
			case err == nil && got == backend.String():
				select {
				case found <- time.Since(t0):
				default:
				}
			case err != nil:
				last.Store(err.Error())
			default:
				last.Store("answered by " + got)
			}
		}()
	}
}

// proxyProc is a proxy running in a node namespace.
type proxyProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProxy runs argv in namespace ns (`ip netns exec` execs it in place:
// the pid is the proxy's), with its output in logPath. It leads its own
// process group and is killed if the test dies; it is forked from a
// thread locked until it is reaped, since Pdeathsig fires when the forking
// thread ends.
func startProxy(ns, logPath string, argv []string) (*proxyProc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proxyProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err != nil {
			return
		}
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	return p, nil
}

// exited returns an error once the proxy has exited.
func (p *proxyProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v; log tail:\n%s", p.cmd.Args[4], p.err, logTail(p.log, 30))
	default:
		return nil
	}
}

// stop sends SIGTERM to the proxy's process group, and SIGKILL after 30 s.
func (p *proxyProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
