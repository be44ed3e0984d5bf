// Package dataplane measures what a ruleset costs the data plane: the
// latency of the first packet of new connections to a ClusterIP, for a node
// programmed with N Services, against the same connections straight to the
// pod (no DNAT). Only the first packet of a flow walks the NAT chains, the
// Service lookup among them (every later one follows its conntrack entry),
// so every sample is a new flow: a TCP connect (SYN to SYN-ACK) or a UDP
// request and its reply from a fresh socket.
//
// The sockets are plain blocking syscalls on a thread locked inside the
// client's network namespace: no netpoller wake-up, no process per sample,
// so that microseconds are not lost in the noise of the Go runtime.
package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// The shape of the programmed state.
const (
	// Endpoints is the number of endpoints of every Service.
	Endpoints = 10
	// ServicePort is every Service's port.
	ServicePort = 80
	// BackendPort is the first port of the real endpoints; they use
	// BackendPort .. BackendPort+Endpoints-1 of one pod.
	BackendPort = 8000
	// MaxServices is what fits in 10.96.0.0/16 with room to spare.
	MaxServices = 65000
	// NodeName is the node the state is for.
	NodeName = "node-1"
)

// Targets are the two Services of a State whose endpoints are real.
type Targets struct {
	TCP, UDP netip.AddrPort // ClusterIP:ServicePort
}

// State returns n Services (n >= 2) with Endpoints endpoints each, one port
// each, TCP for even indexes and UDP for odd ones, ClusterIPs from
// 10.96.0.1 on. The endpoints are addresses in 10.128.0.0/9 that nothing
// answers, except for the two Services in the middle (one of each
// protocol), whose endpoints are pod:BackendPort+j.
func State(n int, pod netip.Addr) (*model.State, Targets, error) {
	if n < 2 || n > MaxServices {
		return nil, Targets{}, fmt.Errorf("%d services: want 2..%d", n, MaxServices)
	}
	if !pod.Is4() {
		return nil, Targets{}, fmt.Errorf("pod address %v: want IPv4", pod)
	}
	st := model.NewState()
	st.Node = model.Node{Name: NodeName}
	mid := n / 2 &^ 1 // even: TCP; mid+1 is UDP
	var tg Targets
	services, endpoints := st.Services.Edit(), st.Endpoints.Edit()
	for i := range n {
		name := model.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "p"}
		proto := model.TCP
		if i%2 == 1 {
			proto = model.UDP
		}
		ip := addr4(10<<24 | 96<<16 | uint32(i+1))
		services.Set(name, &model.ServicePort{Name: name, Protocol: proto, Port: ServicePort, ClusterIPs: []netip.Addr{ip}})
		eps := make([]model.Endpoint, Endpoints)
		for j := range eps {
			ep := model.Endpoint{Addr: addr4(10<<24 | 128<<16 | uint32(i*Endpoints+j)), Port: 8080,
				NodeName: NodeName, Ready: true, Serving: true}
			if i == mid || i == mid+1 {
				ep.Addr, ep.Port = pod, uint16(BackendPort+j)
			}
			eps[j] = ep
		}
		endpoints.Set(name, eps)
		switch i {
		case mid:
			tg.TCP = netip.AddrPortFrom(ip, ServicePort)
		case mid + 1:
			tg.UDP = netip.AddrPortFrom(ip, ServicePort)
		}
	}
	st.Services, st.Endpoints = services.Map(), endpoints.Map()
	return st, tg, nil
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// BackendName is the name the echo server on port BackendPort+j answers with.
func BackendName(j int) string { return fmt.Sprintf("ep-%d", BackendPort+j) }

// Reply is what one sample got back.
type Reply struct {
	Backend string         // the echo server's name
	Source  netip.AddrPort // the request's source as the server saw it
	From    netip.AddrPort // UDP: where the reply came from (want: the target)
}

// sockaddr4 converts an IPv4 address and port for the socket calls.
func sockaddr4(ap netip.AddrPort) (*unix.SockaddrInet4, error) {
	if !ap.Addr().Is4() {
		return nil, fmt.Errorf("%v: IPv4 only", ap)
	}
	return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}, nil
}

// socket opens a blocking IPv4 socket whose calls give up after timeout.
func socket(typ int, timeout time.Duration) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} { // SNDTIMEO bounds connect
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("socket timeout: %w", err)
		}
	}
	return fd, nil
}

// retryEINTR calls f again while a signal interrupts it (see connect).
func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// connect is a blocking connect that a signal does not cut short: Go's
// runtime interrupts a thread's system call to preempt it (SIGURG), and an
// interrupted connect goes on in the kernel, so it waits for the socket
// to be writable and reads the outcome.
func connect(fd int, sa unix.Sockaddr, timeout time.Duration) error {
	err := unix.Connect(fd, sa)
	if !errors.Is(err, unix.EINTR) {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline).Milliseconds()
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(left))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return unix.ETIMEDOUT
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}

// TCPConnect opens a new TCP connection to dst from the calling thread's
// network namespace and returns how long connect took (the SYN's way out
// and the SYN-ACK's way back). Then, untimed, it asks the echo server for
// its name and the source it saw, so that the caller can check who
// answered.
func TCPConnect(dst netip.AddrPort, timeout time.Duration) (time.Duration, Reply, error) {
	sa, err := sockaddr4(dst)
	if err != nil {
		return 0, Reply{}, err
	}
	fd, err := socket(unix.SOCK_STREAM, timeout)
	if err != nil {
		return 0, Reply{}, err
	}
	defer unix.Close(fd)
	start := time.Now()
	err = connect(fd, sa, timeout)
	d := time.Since(start)
	if err != nil {
		return 0, Reply{}, fmt.Errorf("tcp connect %v: %w", dst, err)
	}
	if _, err := retryEINTR(func() (int, error) { return unix.Write(fd, []byte("hello\n")) }); err != nil {
		return d, Reply{}, fmt.Errorf("tcp %v: write: %w", dst, err)
	}
	var line []byte
	buf := make([]byte, 256)
	for !slices.Contains(line, '\n') {
		n, err := retryEINTR(func() (int, error) { return unix.Read(fd, buf) })
		if err != nil {
			return d, Reply{}, fmt.Errorf("tcp %v: read: %w", dst, err)
		}
		if n == 0 {
			return d, Reply{}, fmt.Errorf("tcp %v: connection closed after %q", dst, line)
		}
		line = append(line, buf[:n]...)
	}
	name, src, err := echo.ParseReply(string(line))
	if err != nil {
		return d, Reply{}, fmt.Errorf("tcp %v: %w", dst, err)
	}
	return d, Reply{Backend: name, Source: src}, nil
}

// UDPRequest sends one datagram to dst from a new socket in the calling
// thread's network namespace and returns how long the reply took.
func UDPRequest(dst netip.AddrPort, timeout time.Duration) (time.Duration, Reply, error) {
	sa, err := sockaddr4(dst)
	if err != nil {
		return 0, Reply{}, err
	}
	fd, err := socket(unix.SOCK_DGRAM, timeout)
	if err != nil {
		return 0, Reply{}, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	start := time.Now()
	if _, err := retryEINTR(func() (int, error) { return 0, unix.Sendto(fd, []byte("hello\n"), 0, sa) }); err != nil {
		return 0, Reply{}, fmt.Errorf("udp %v: send: %w", dst, err)
	}
	var from unix.Sockaddr
	n, err := retryEINTR(func() (n int, err error) {
		n, from, err = unix.Recvfrom(fd, buf, 0)
		return n, err
	})
	d := time.Since(start)
	if err != nil {
		return 0, Reply{}, fmt.Errorf("udp %v: receive: %w", dst, err)
	}
	r := Reply{}
	if f, ok := from.(*unix.SockaddrInet4); ok {
		r.From = netip.AddrPortFrom(netip.AddrFrom4(f.Addr), uint16(f.Port))
	}
	r.Backend, r.Source, err = echo.ParseReply(string(buf[:n]))
	if err != nil {
		return d, Reply{}, fmt.Errorf("udp %v: %w", dst, err)
	}
	return d, r, nil
}

// Check reports a reply that did not come from one of the backends wanted
// (names), or that shows the source rewritten (the server must see src) or,
// for UDP, a reply from another address than the one asked (dst).
func Check(r Reply, wanted []string, src netip.Addr, dst netip.AddrPort, udp bool) error {
	var errs []error
	if !slices.Contains(wanted, r.Backend) {
		errs = append(errs, fmt.Errorf("answered by %q, want one of %s", r.Backend, strings.Join(wanted, ", ")))
	}
	if r.Source.Addr() != src {
		errs = append(errs, fmt.Errorf("the server saw source %v, want %v (no masquerade)", r.Source, src))
	}
	if udp && r.From != dst {
		errs = append(errs, fmt.Errorf("reply from %v, want %v", r.From, dst))
	}
	return errors.Join(errs...)
}
