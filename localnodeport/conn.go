package localnodeport

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
)

// handle copies one client connection to an endpoint and back, each
// direction's end passed on as a half-close, until both are done or the
// proxy closes. A client whose endpoint cannot be reached is closed.
func (l *listener) handle(client *net.TCPConn) {
	defer client.Close()
	from := addrOf(client.RemoteAddr())
	to, name, ok := l.pick(from)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(l.p.ctx, dialTimeout)
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", to.String())
	cancel()
	if err != nil {
		l.p.log.Debug("localhost NodePort: endpoint not reached; closing the client", "servicePort", name, "endpoint", to, "err", err)
		return
	}
	backend := c.(*net.TCPConn)
	defer backend.Close()
	// Close both when the proxy closes: the copies then end at once.
	stop := context.AfterFunc(l.p.ctx, func() {
		_ = client.Close()
		_ = backend.Close()
	})
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pipe(backend, client) }()
	go func() { defer wg.Done(); pipe(client, backend) }()
	wg.Wait()
}

// pipe copies from src to dst, then tells dst that nothing more comes.
func pipe(dst, src *net.TCPConn) {
	_, _ = io.Copy(dst, src)
	_ = dst.CloseWrite()
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
