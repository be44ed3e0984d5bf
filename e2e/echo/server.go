// Package echo is the traffic of the kernel tests: servers that answer every
// TCP connection and every UDP datagram with their name and the address
// they saw the request come from, and a client that counts who answered and
// which source addresses they saw (to check DNAT, load balancing and
// masquerade). The e2e-agent binary wraps it.
package echo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Reply is what a server answers: "NAME ADDR:PORT", the address being the
// request's source as the server saw it.
func Reply(name string, remote netip.AddrPort) string {
	return name + " " + netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port()).String()
}

// ErrBadReply is wrapped by ParseReply's errors.
var ErrBadReply = errors.New("bad reply")

// ParseReply splits a reply into the server's name and the source address.
func ParseReply(line string) (name string, source netip.AddrPort, err error) {
	line = strings.TrimSpace(line)
	name, addr, ok := strings.Cut(line, " ")
	if !ok || name == "" {
		return "", netip.AddrPort{}, fmt.Errorf("%w %q", ErrBadReply, line)
	}
	source, err = netip.ParseAddrPort(addr)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("%w %q: %v", ErrBadReply, line, err)
	}
	return name, source, nil
}

// How long a TCP connection may stay open, and how long the server waits for
// a silent client to send something before it answers anyway.
const (
	connTimeout = 5 * time.Second
	peekTimeout = 200 * time.Millisecond
)

// Server answers on TCP and UDP listeners.
type Server struct {
	Name string
	// Logf, if set, gets errors that do not stop the server.
	Logf func(format string, args ...any)

	tcp []net.Listener
	udp []*net.UDPConn
}

// Listen opens the listeners. An address without a host (":8080") opens one
// IPv4 and one IPv6-only socket, so that both families are served whatever
// net.ipv6.bindv6only says; an empty address opens nothing.
func Listen(name, tcpAddr, udpAddr string) (*Server, error) {
	s := &Server{Name: name}
	for _, a := range splitFamilies(tcpAddr, "tcp") {
		l, err := net.Listen(a.network, a.addr)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("listen %s %s: %w", a.network, a.addr, err)
		}
		s.tcp = append(s.tcp, l)
	}
	for _, a := range splitFamilies(udpAddr, "udp") {
		c, err := net.ListenPacket(a.network, a.addr)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("listen %s %s: %w", a.network, a.addr, err)
		}
		s.udp = append(s.udp, c.(*net.UDPConn))
	}
	if len(s.tcp)+len(s.udp) == 0 {
		return nil, errors.New("no TCP or UDP address to listen on")
	}
	return s, nil
}

type netAddr struct{ network, addr string }

func splitFamilies(addr, proto string) []netAddr {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return []netAddr{{proto, addr}}
	}
	return []netAddr{
		{proto + "4", net.JoinHostPort("0.0.0.0", port)},
		{proto + "6", net.JoinHostPort("::", port)},
	}
}

// Addrs lists the bound addresses, e.g. "tcp4 0.0.0.0:8080".
func (s *Server) Addrs() []string {
	var out []string
	for _, l := range s.tcp {
		out = append(out, l.Addr().Network()+" "+l.Addr().String())
	}
	for _, c := range s.udp {
		out = append(out, c.LocalAddr().Network()+" "+c.LocalAddr().String())
	}
	return out
}

// TCPAddr and UDPAddr return the first bound address of each kind (for
// tests listening on port 0).
func (s *Server) TCPAddr() net.Addr { return s.tcp[0].Addr() }
func (s *Server) UDPAddr() net.Addr { return s.udp[0].LocalAddr() }

// Close closes the listeners; Serve then returns.
func (s *Server) Close() error {
	var errs []error
	for _, l := range s.tcp {
		errs = append(errs, l.Close())
	}
	for _, c := range s.udp {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Serve answers until ctx ends, then closes the listeners, waits for open
// connections and returns nil. It returns an error if a listener fails.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(s.tcp)+len(s.udp))
	for _, l := range s.tcp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- s.serveTCP(ctx, l, &wg)
		}()
	}
	for _, c := range s.udp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- s.serveUDP(ctx, c)
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	s.Close()
	wg.Wait()
	return err
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

func (s *Server) serveTCP(ctx context.Context, l net.Listener, wg *sync.WaitGroup) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %v: %w", l.Addr(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.answerTCP(c.(*net.TCPConn)); err != nil {
				s.logf("tcp %v: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// httpMethods start the requests answered with an HTTP response (for curl).
var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "OPTIONS "}

// answerTCP writes the reply as a raw line or, if the client sent an HTTP
// request, as the body of an HTTP/1.1 response. Then it half-closes and
// drains the connection, so the client sees a clean EOF (never a reset)
// and this side, not the client's, keeps the TIME_WAIT.
func (s *Server) answerTCP(c *net.TCPConn) error {
	defer c.Close()
	c.SetDeadline(time.Now().Add(connTimeout))
	line := Reply(s.Name, c.RemoteAddr().(*net.TCPAddr).AddrPort()) + "\n"

	// Our client sends a line first; a silent client (nc) gets its
	// answer after peekTimeout.
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(peekTimeout))
	n, err := c.Read(buf)
	var ne net.Error
	if err != nil && err != io.EOF && !(errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("read: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(connTimeout))
	req := buf[:n]
	var resp string
	if isHTTP(req) {
		// Read the rest of the request head.
		for !bytes.Contains(req, []byte("\r\n\r\n")) && !bytes.Contains(req, []byte("\n\n")) && len(req) < 64<<10 {
			m, err := c.Read(buf)
			req = append(req, buf[:m]...)
			if err != nil {
				break
			}
		}
		body := line
		if bytes.HasPrefix(req, []byte("HEAD ")) {
			body = ""
		}
		resp = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(line), body)
	} else {
		resp = line
	}
	if _, err := io.WriteString(c, resp); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := c.CloseWrite(); err != nil {
		return fmt.Errorf("close write: %w", err)
	}
	// Wait for the client's FIN.
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}

func isHTTP(req []byte) bool {
	for _, m := range httpMethods {
		if bytes.HasPrefix(req, []byte(m)) {
			return true
		}
	}
	return false
}

func (s *Server) serveUDP(ctx context.Context, c *net.UDPConn) error {
	buf := make([]byte, 64<<10)
	for {
		_, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read on %v: %w", c.LocalAddr(), err)
		}
		if _, err := c.WriteToUDPAddrPort([]byte(Reply(s.Name, from)+"\n"), from); err != nil {
			s.logf("udp %v: write: %v", from, err)
		}
	}
}
