package nlmsg

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// getLink is an RTM_GETLINK request: a dump of every link, or the link
// named name.
func getLink(seq uint32, name string) []byte {
	flags := uint16(unix.NLM_F_REQUEST)
	if name == "" {
		flags |= unix.NLM_F_DUMP
	}
	var a Attrs
	if name != "" {
		a.Put(unix.IFLA_IFNAME, append([]byte(name), 0)...)
	}
	req := make([]byte, HdrLen+unix.SizeofIfInfomsg, HdrLen+unix.SizeofIfInfomsg+len(a))
	req = append(req, a...)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETLINK)
	binary.NativeEndian.PutUint16(req[6:], flags)
	binary.NativeEndian.PutUint32(req[8:], seq)
	return req
}

// ReceiveAnswers, against the kernel's rtnetlink: a dump's messages up to
// NLMSG_DONE, then a failed request's error code; the answers of a request
// sent before and never read are skipped.
func TestReceiveAnswers(t *testing.T) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		t.Skipf("no rtnetlink socket here: %v", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 1<<16)
	for _, req := range [][]byte{getLink(1, "lo"), getLink(2, "")} {
		if err := Send(fd, req); err != nil {
			t.Fatal(err)
		}
	}
	links := 0
	err = ReceiveAnswers(fd, buf, 2, func(typ uint16, _ []byte) {
		if typ == unix.RTM_NEWLINK {
			links++
		}
	})
	if err != nil || links == 0 {
		t.Errorf("dump of the links: %d links, %v; want at least lo", links, err)
	}

	if err := Send(fd, getLink(3, "no-such-link0")); err != nil {
		t.Fatal(err)
	}
	called := false
	err = ReceiveAnswers(fd, buf, 3, func(uint16, []byte) { called = true })
	if !errors.Is(err, unix.ENODEV) || called {
		t.Errorf("a missing link: %v (fn called: %v), want ENODEV alone", err, called)
	}
}
