package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Two UDP Services of the conntrack tests, besides the example state:
// ct-udp (endpoints as the test says) and ct-empty (no endpoints at first).
const (
	ctUDPClusterIP   = "10.96.0.54"
	ctUDPNodePort    = "30054"
	ctEmptyClusterIP = "10.96.0.55"
	ctEmptyNodePort  = "30055"
)

const ctServices = `apiVersion: v1
kind: Service
metadata: {name: ct-udp, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.54
  clusterIPs: [10.96.0.54]
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30054}]
---
apiVersion: v1
kind: Service
metadata: {name: ct-empty, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.55
  clusterIPs: [10.96.0.55]
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30055}]
`

// ctSlice is an EndpointSlice of service with the given pods as ready
// endpoints on this node.
func ctSlice(service string, pods ...sandbox.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-ipv4
  namespace: default
  labels: {kubernetes.io/service-name: %s}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 5353}]
endpoints:`, service, service)
	if len(pods) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: %s\n", p.IPv4, nodeName)
	}
	return b.String()
}

func newConntrackEnv(t *testing.T, proxyArgs ...string) *env {
	return newEnv(t, envOptions{
		pods: []sandbox.Pod{podA, podB, podC},
		extra: map[string]string{
			"ct-services.yaml": ctServices,
			"ct-udp.yaml":      ctSlice("ct-udp", podA),
			"ct-empty.yaml":    ctSlice("ct-empty"),
		},
		proxyArgs: proxyArgs,
	})
}

// setEndpoints rewrites a Service's slice and waits for the sync that
// applies it; it returns when that sync was seen in the log.
func (e *env) setEndpoints(t *testing.T, service string, pods ...sandbox.Pod) time.Time {
	t.Helper()
	before := e.proxy.syncs()
	writeAtomic(t, e.state, service+".yaml", ctSlice(service, pods...))
	written := time.Now()
	e.proxy.waitLog(t, 10*time.Second, "the sync of the new endpoints", func(lines []string) bool {
		return countSyncs(lines) > before
	})
	t.Logf("%s: endpoints written at %s, sync seen %v later", service, written.Format("15:04:05.000"), time.Since(written))
	return time.Now()
}

// udpStream is a UDP client sending from one fixed source port, so every
// datagram belongs to the same conntrack entry.
type udpStream struct {
	ns, addr string
	srcPort  int
}

func (u udpStream) args(extra ...string) []string {
	return append([]string{"--src-port", fmt.Sprint(u.srcPort), "--timeout", "300ms", "--results", "all"}, extra...)
}

// run sends count datagrams, one every 100 ms, and returns the summary.
func (u udpStream) run(t *testing.T, e *env, count int) *echo.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sum, err := e.client(ctx, u.ns, "udp", u.addr, count, u.args("--interval", "100ms")...)
	if sum == nil {
		t.Fatalf("udp client %s -> %s: %v", u.ns, u.addr, err)
	}
	return sum
}

// background sends one datagram every 100 ms for d; the summary and the
// time it started arrive on the channel.
func (u udpStream) background(t *testing.T, e *env, d time.Duration) (time.Time, <-chan *echo.Summary) {
	t.Helper()
	out := make(chan *echo.Summary, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
		defer cancel()
		sum, _ := e.client(ctx, u.ns, "udp", u.addr, 0, u.args("--interval", "100ms", "--duration", d.String())...)
		out <- sum
	}()
	return start, out
}

// whileSetting sends a datagram every 100 ms for 3 s while service's
// endpoints become pods, and returns the results of the datagrams sent
// after the sync that applied them (and one interval more).
func (u udpStream) whileSetting(t *testing.T, e *env, service string, pods ...sandbox.Pod) []echo.Result {
	t.Helper()
	start, done := u.background(t, e, 3*time.Second)
	synced := e.setEndpoints(t, service, pods...)
	sum := <-done
	if sum == nil {
		t.Fatal("the background client printed no summary")
	}
	late, early := after(sum, start, synced, 200*time.Millisecond)
	if len(late) < 5 || early == 0 {
		t.Fatalf("want datagrams before and at least 5 after the sync; got %d before, %d after", early, len(late))
	}
	return late
}

// after returns the results that started more than margin after t (the
// client started at start) and whether any came before.
func after(sum *echo.Summary, start, t time.Time, margin time.Duration) (late []echo.Result, early int) {
	cut := float64(t.Sub(start)+margin) / float64(time.Millisecond)
	for _, r := range sum.Results {
		if r.AtMS > cut {
			late = append(late, r)
		} else {
			early++
		}
	}
	return late, early
}

func backendsOf(rs []echo.Result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		if r.Error != "" {
			m["error: "+r.Error]++
		} else {
			m[r.Backend]++
		}
	}
	return m
}

// A UDP client keeps sending from one source port while its Service's only
// endpoint is replaced. kube-proxy's conntrack cleanup deletes the entry
// pinned to the removed endpoint, so the next datagram after the sync goes
// to the new one; with the cleanup off, the datagrams keep reaching the
// removed (still running) pod for as long as the client sends.
func TestConntrackStaleUDPEndpoint(t *testing.T) {
	t.Parallel()
	for _, cleanup := range []bool{true, false} {
		t.Run(fmt.Sprintf("cleanup=%v", cleanup), func(t *testing.T) {
			var args []string
			if !cleanup {
				args = append(args, "--testing-skip-conntrack-cleanup")
			}
			e := newConntrackEnv(t, args...)
			paths := []struct {
				name string
				udp  udpStream
			}{
				{"ClusterIP from a pod", udpStream{podC.Name, hostPort(ctUDPClusterIP, "53"), 40053}},
				{"NodePort from the external client", udpStream{sandbox.Client, hostPort(sandbox.NodeIPv4.Addr().String(), ctUDPNodePort), 40054}},
			}
			from, to := podA, podB
			for _, p := range paths {
				t.Run(p.name, func(t *testing.T) {
					// The flow is established on the current endpoint.
					expectBackends(t, "before the change", p.udp.run(t, e, 3), from.Name)
					late := p.udp.whileSetting(t, e, "ct-udp", to)
					want := to.Name
					if !cleanup {
						want = from.Name // pinned by the stale entry
					}
					if got := backendsOf(late); len(got) != 1 || got[want] != len(late) {
						t.Errorf("after the sync, answered by %v; want all by %s", got, want)
					}
					t.Logf("after the sync: %v", backendsOf(late))
				})
				from, to = to, from
			}
			// The cleanups are counted: one entry per path at least.
			var m metrics
			e.proxy.poll(t, 10*time.Second, "/metrics", func(ctx context.Context) error {
				var err error
				m, err = (&apiEnv{env: e}).fetchMetrics(ctx)
				return err
			})
			deleted, ran := m["kubeproxy_conntrack_reconciler_deleted_entries_total"], m["kubeproxy_conntrack_reconciler_sync_duration_seconds_count"]
			if cleanup && (deleted < 2 || ran < 2) {
				t.Errorf("conntrack metrics: %v entries deleted in %v cleanups; want at least 2 of each", deleted, ran)
			}
			if !cleanup && deleted != 0 {
				t.Errorf("conntrack metrics: %v entries deleted with the cleanup off", deleted)
			}
		})
	}
}

// A UDP client is already sending to a Service without endpoints when it
// gets one: its datagrams are answered from the sync on.
func TestConntrackServiceGetsEndpoints(t *testing.T) {
	t.Parallel()
	e := newConntrackEnv(t)
	u := udpStream{podC.Name, hostPort(ctEmptyClusterIP, "53"), 40055}
	if sum := u.run(t, e, 2); sum.OK != 0 {
		t.Fatalf("a Service without endpoints answered: %v", sum.Backend)
	}
	late := u.whileSetting(t, e, "ct-empty", podB)
	if got := backendsOf(late); len(got) != 1 || got[podB.Name] != len(late) {
		t.Errorf("after the sync, answered by %v; want all by %s", got, podB.Name)
	}
	nodePort := udpStream{sandbox.Client, hostPort(sandbox.NodeIPv4.Addr().String(), ctEmptyNodePort), 40056}
	expectBackends(t, "NodePort after the sync", nodePort.run(t, e, 3), podB.Name)
}

// dialFrom opens a TCP connection from inside namespace ns. (The thread
// that switches namespaces must switch back rather than die: processes the
// sandbox started from it would get their parent-death signal.)
func dialFrom(t *testing.T, ns, addr string) *net.TCPConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := dialInNetNS(ctx, ns, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns, err)
	}
	return c.(*net.TCPConn)
}

// conntrackIn lists the node's conntrack entries of one protocol.
func conntrackIn(t *testing.T, sb *sandbox.Sandbox, proto uint8) []conntrack.Flow {
	t.Helper()
	c, err := conntrack.Dial("/run/netns/" + sb.NS(sandbox.Node))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	flows, err := c.List(unix.AF_INET, proto)
	if err != nil {
		t.Fatal(err)
	}
	return flows
}

// A TCP connection to a live endpoint is untouched by syncs that change
// other endpoints (and their conntrack cleanup): its conntrack entry stays,
// and the connection still carries data both ways.
func TestConntrackTCPSurvivesSyncs(t *testing.T) {
	t.Parallel()
	e := newConntrackEnv(t)
	// A UDP flow to the endpoint about to go, so the cleanup has work.
	u := udpStream{podC.Name, hostPort(ctUDPClusterIP, "53"), 40057}
	expectBackends(t, "UDP before", u.run(t, e, 2), podA.Name)

	conn := dialFrom(t, e.sb.NS(podC.Name), hostPort(webClusterIPv4, webPort))
	defer conn.Close()
	if _, err := conn.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(4 * time.Second)) // the agent drains for 5 s at most
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	backend, _, err := echo.ParseReply(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	entry := func() (conntrack.Flow, bool) {
		for _, f := range conntrackIn(t, e.sb, 6) {
			if f.OrigSrc.Port() == local.Port() && f.OrigDst == netip.MustParseAddrPort(hostPort(webClusterIPv4, webPort)) {
				return f, true
			}
		}
		return conntrack.Flow{}, false
	}
	before, ok := entry()
	if !ok {
		t.Fatalf("no conntrack entry for the TCP connection from port %d", local.Port())
	}

	// A UDP flow to a Service whose endpoints stay: the cleanup must leave it.
	keep := udpStream{podC.Name, hostPort(dnsClusterIP, dnsPort), 40058}
	if sum := keep.run(t, e, 2); sum.Failed > 0 {
		t.Fatalf("UDP to %s: %s", keep.addr, firstError(sum))
	}
	keepID := flowID(conntrackIn(t, e.sb, 17), 40058)
	if keepID == 0 {
		t.Fatal("no conntrack entry for the UDP flow from port 40058")
	}

	// Two syncs that change other endpoints, with a cleanup that deletes a
	// stale UDP flow.
	e.setEndpoints(t, "ct-udp", podB)
	e.setEndpoints(t, "ct-empty", podA)
	udpFlows := conntrackIn(t, e.sb, 17)
	if hasFlowFrom(udpFlows, 40057) {
		t.Errorf("the stale UDP flow from port 40057 is still there: the cleanup did not run")
	}
	if id := flowID(udpFlows, 40058); id != keepID {
		t.Errorf("the UDP flow to live endpoints (from port 40058) was deleted by the cleanup (id %d, now %d)", keepID, id)
	}
	now, ok := entry()
	if !ok || now.ID != before.ID {
		t.Fatalf("the TCP connection's conntrack entry (to %s) is gone or replaced: before %+v, now %+v (found %v)", backend, before, now, ok)
	}
	// The connection still works: the server drains what we send and
	// closes when we do. Our socket reaches TIME_WAIT or CLOSE only once the
	// server has acknowledged our data and FIN over the path; a reset (a
	// broken path) shows as ECONNRESET on the read below.
	if _, err := conn.Write([]byte("more data\n")); err != nil {
		t.Fatalf("writing after the syncs: %v", err)
	}
	if err := conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	err = sandbox.Poll(t.Context(), 3*time.Second, 20*time.Millisecond, func(context.Context) error {
		st := tcpState(t, conn)
		if st == unix.BPF_TCP_TIME_WAIT || st == unix.BPF_TCP_CLOSE {
			return nil
		}
		return fmt.Errorf("TCP state %d", st)
	})
	if err != nil {
		t.Fatalf("the server did not acknowledge our data and FIN: %v", err)
	}
	buf := make([]byte, 64)
	if n, err := conn.Read(buf); err != io.EOF {
		t.Errorf("after the syncs: read %q, %v; want a clean EOF", buf[:n], err)
	}
}

func tcpState(t *testing.T, c *net.TCPConn) uint8 {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var serr error
	if err := raw.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || serr != nil {
		t.Fatalf("TCP_INFO: %v %v", err, serr)
	}
	return info.State
}

// flowID is the id of the entry from srcPort, 0 if there is none.
func flowID(flows []conntrack.Flow, srcPort uint16) uint32 {
	for _, f := range flows {
		if f.OrigSrc.Port() == srcPort {
			return f.ID
		}
	}
	return 0
}

func hasFlowFrom(flows []conntrack.Flow, srcPort uint16) bool {
	for _, f := range flows {
		if f.OrigSrc.Port() == srcPort {
			return true
		}
	}
	return false
}
