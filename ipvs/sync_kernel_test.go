package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// inNetns runs fn on a thread inside the namespace at path; sockets it
// opens and processes it starts stay there.
func inNetns(t testing.TB, path string, fn func() error) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // the thread dies with the goroutine
		f, err := os.Open(path)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			err = fn()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("in %s: %v", path, err)
	}
}

// bulkState is demoState plus n ClusterIP services of two endpoints.
func bulkState(n int) *model.State {
	st := demoState()
	for i := range n {
		name := spn("bulk", fmt.Sprintf("s%d", i), "")
		st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})}})
		st.Endpoints = st.Endpoints.With(name, []model.Endpoint{ready("10.244.2.1", 80, "b"), ready("10.244.2.2", 80, "b")})
	}
	return st
}

// kernelHolds fails t when the kernel's table is not the plan's.
func kernelHolds(t *testing.T, c *ipvsnl.Conn, p *Plan) {
	t.Helper()
	got, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	ipvsnltest.SameTables(t, "kernel vs plan", withoutCounts(got), p.VirtualServers())
}

// withoutCounts zeroes the connection counts (a plan has none).
func withoutCounts(vss []ipvsnl.VirtualServer) []ipvsnl.VirtualServer {
	vss = ipvsnltest.Normalize(vss)
	for _, v := range vss {
		for i := range v.Dests {
			v.Dests[i].Active, v.Dests[i].Inactive = 0, 0
		}
	}
	return vss
}

func TestKernelSyncer(t *testing.T) {
	c, ns := ipvsnltest.DialNew(t)
	h := NewFakeHelper()
	s := NewSyncer(c, h, SyncConfig{})
	st := bulkState(50)
	pl := NewPlanner(Config{})
	p := pl.Plan(st, nodeAddrs)
	res, err := s.Sync(p)
	if err != nil {
		t.Fatal(err)
	}
	kernelHolds(t, c, p)
	if res.Writes != 1 || c.Writes() < 2 {
		t.Errorf("first sync: %d Apply calls, %d writes in all", res.Writes, c.Writes())
	}

	// One UDP endpoint gone: one command in one write, nothing read.
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsUDP, st.Endpoints.Get(dnsUDP)[:1])
	w0 := c.Writes()
	p = pl.Plan(next, nodeAddrs)
	if res, err = s.Sync(p); err != nil {
		t.Fatal(err)
	}
	if res.Ops != 1 || res.Writes != 1 || c.Writes()-w0 != 1 || res.DestReads != 0 {
		t.Errorf("one endpoint removed cost %d commands, %d writes (%d sendmsg), %d dest reads", res.Ops, res.Writes, c.Writes()-w0, res.DestReads)
	}
	kernelHolds(t, c, p)

	// A restart: a new Syncer and socket adopt the table without a
	// command; then one change is one command again.
	c2 := ipvsnltest.Dial(t, ns)
	s2 := NewSyncer(c2, h, SyncConfig{})
	if res, err = s2.Sync(p); err != nil {
		t.Fatal(err)
	}
	if res.Ops != 0 || res.Writes != 0 {
		t.Errorf("a restart on an up-to-date table sent %d commands", res.Ops)
	}
	next2 := clone(next)
	next2.Endpoints = next2.Endpoints.With(dnsUDP, st.Endpoints.Get(dnsUDP))
	p = pl.Plan(next2, nodeAddrs)
	w0 = c2.Writes()
	if res, err = s2.Sync(p); err != nil {
		t.Fatal(err)
	}
	if res.Ops != 1 || c2.Writes()-w0 != 1 {
		t.Errorf("after the restart one endpoint back cost %d commands, %d writes", res.Ops, c2.Writes()-w0)
	}
	kernelHolds(t, c, p)
}

// A TCP real server removed while a connection through IPVS is open keeps
// serving it with weight 0; new connections go elsewhere; it is deleted
// once the drain bound passes (its closed connection stays counted as
// inactive for IPVS's TIME_WAIT, two minutes).
func TestKernelSyncerDrain(t *testing.T) {
	c, ns := ipvsnltest.DialNew(t)
	vip := netip.MustParseAddrPort("10.96.0.50:80")
	rs := []string{"10.244.0.50", "10.244.0.51"}
	var lns []net.Listener
	inNetns(t, ns, func() error {
		ip := exec.Command("ip", "-b", "-")
		ip.Stdin = strings.NewReader(fmt.Sprintf("addr add %s/32 dev lo\naddr add %s/32 dev lo\naddr add %s/32 dev lo\n", vip.Addr(), rs[0], rs[1]))
		if out, err := ip.CombinedOutput(); err != nil {
			return fmt.Errorf("ip: %v: %s", err, out)
		}
		for _, a := range rs {
			ln, err := net.Listen("tcp4", a+":8080")
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	for _, ln := range lns {
		t.Cleanup(func() { ln.Close() })
		go echo(ln)
	}

	clk := &clock{time.Unix(1e9, 0)}
	s := NewSyncer(c, NewFakeHelper(), SyncConfig{DrainTimeout: 15 * time.Minute, DrainCheck: time.Minute, Now: clk.now})
	name := spn("default", "web", "http")
	st := model.NewState()
	st.Node = model.Node{Name: node}
	st.Services = st.Services.With(name, &model.ServicePort{Name: name, Protocol: model.TCP, Port: vip.Port(), ClusterIPs: []netip.Addr{vip.Addr()}})
	st.Endpoints = st.Endpoints.With(name, []model.Endpoint{ready(rs[0], 8080, node), ready(rs[1], 8080, node)})
	key := ipvsnl.ServiceKey{Addr: vip.Addr(), Protocol: model.TCP, Port: vip.Port()}
	pl := NewPlanner(Config{})
	if _, err := s.Sync(pl.Plan(st, nil)); err != nil {
		t.Fatal(err)
	}

	// A connection through the virtual server, held open.
	var conn net.Conn
	inNetns(t, ns, func() (err error) {
		conn, err = net.DialTimeout("tcp4", vip.String(), 5*time.Second)
		return err
	})
	defer conn.Close()
	talk := func(msg string) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(conn, "%s\n", msg); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || got != msg+"\n" {
			t.Fatalf("echo through %s: %q, %v", vip, got, err)
		}
	}
	talk("hello")
	ds, err := c.Dests(key)
	if err != nil {
		t.Fatal(err)
	}
	used := slices.IndexFunc(ds, func(d ipvsnl.Dest) bool { return d.Active == 1 })
	if used < 0 {
		t.Fatalf("no real server counts the connection: %+v", ds)
	}
	usedAddr := ds[used].Addr
	other := rs[0]
	if usedAddr.Addr().String() == rs[0] {
		other = rs[1]
	}

	// The endpoint that holds it goes away: weight 0, still there.
	next := clone(st)
	next.Endpoints = next.Endpoints.With(name, []model.Endpoint{ready(other, 8080, node)})
	res, err := s.Sync(pl.Plan(next, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res.Draining != 1 || res.DestReads != 1 {
		t.Errorf("sync after the removal: %+v, want one draining server, its service read once", res)
	}
	vss, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := []ipvsnl.VirtualServer{{Service: pl.Plan(next, nil).VirtualServers()[0].Service, Dests: []ipvsnl.Dest{
		{Addr: usedAddr, Weight: 0, Active: 1},
		{Addr: netip.AddrPortFrom(netip.MustParseAddr(other), 8080), Weight: 1},
	}}}
	ipvsnltest.SameTables(t, "draining (/proc/net/ip_vs)", vss, want)
	talk("still served at weight 0")

	// New connections go to the other server only.
	for range 3 {
		var c2 net.Conn
		inNetns(t, ns, func() (err error) {
			c2, err = net.DialTimeout("tcp4", vip.String(), 5*time.Second)
			return err
		})
		c2.Close()
	}
	if ds, err = c.Dests(key); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Addr == usedAddr && d.Active+d.Inactive != 1 {
			t.Errorf("a new connection went to the draining server: %+v", d)
		}
	}
	// /proc/net/ip_vs (Read) and the netlink dump (Dests) agree on
	// weights and connection counts.
	if vss, err = c.Read(); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(vss, func(v ipvsnl.VirtualServer) bool { return v.ServiceKey == key })
	if i < 0 {
		t.Fatalf("Read lost %s", key)
	}
	ipvsnltest.SameTables(t, "/proc/net/ip_vs vs the dump", vss[i:i+1], []ipvsnl.VirtualServer{{Service: vss[i].Service, Dests: ds}})
	if n := ds[0].Active + ds[0].Inactive + ds[1].Active + ds[1].Inactive; n != 4 {
		t.Errorf("%d connections counted, want 4: %+v", n, ds)
	}

	// Closed: the kernel still counts it (inactive, TIME_WAIT), so the
	// next check keeps the server; the drain bound deletes it.
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ds, _ = c.Dests(key)
		i := slices.IndexFunc(ds, func(d ipvsnl.Dest) bool { return d.Addr == usedAddr })
		if i >= 0 && ds[i].Active == 0 && ds[i].Inactive == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after close: %+v, want the draining server with 0 active, 1 inactive", ds)
		}
		time.Sleep(50 * time.Millisecond)
	}
	clk.advance(2 * time.Minute)
	if res, err = s.Sync(pl.Plan(next, nil)); err != nil || res.Draining != 1 || res.Ops != 0 {
		t.Errorf("check with an inactive connection: %+v, %v; want it kept draining", res, err)
	}
	clk.advance(15 * time.Minute)
	if res, err = s.Sync(pl.Plan(next, nil)); err != nil || res.Draining != 0 || res.Ops != 1 {
		t.Errorf("check past the drain bound: %+v, %v; want the server deleted", res, err)
	}
	kernelHolds(t, c, pl.Plan(next, nil))
}

func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := c.Write([]byte(l)); err != nil {
					return
				}
			}
		}()
	}
}
