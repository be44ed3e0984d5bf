package instance

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// On kernels without owned tables, the abstract socket is the lock. Any
// process can bind it, so whoever finds it bound challenges the holder:
// it sends a random nonce, and a kube-nftproxy answers by writing a chain
// named after it into table ip kube-nftproxy-lock-answers, which only a
// process with CAP_NET_ADMIN can do, and the challenger reads back. A holder that
// cannot is no proxy: the challenger starts anyway and says who squats.
const (
	// AnswersTable is the table of the answers (family TableFamily).
	AnswersTable  = "kube-nftproxy-lock-answers"
	challengeLen  = 16
	answerTimeout = 2 * time.Second
	// answerPause paces the holder's answers, each an nftables
	// transaction, whoever keeps asking.
	answerPause = 50 * time.Millisecond
)

// socketListener holds the abstract socket and answers challenges.
type socketListener struct {
	l    *net.UnixListener
	k    *nftlib.Kernel // writes the answers
	done chan struct{}
}

// acquireSocket listens on the abstract socket, on kernels without owned
// tables. When a process that cannot run a proxy holds it, the lock comes
// back Squatted (and holds nothing).
func acquireSocket(netnsPath string) (*Lock, error) {
	k, err := nftlib.OpenKernel(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	var l *net.UnixListener
	err = netns.Do(netnsPath, func() (err error) {
		l, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@" + Name, Net: "unix"})
		return err
	})
	if err == nil {
		return listenOn(l, k)
	}
	defer k.Close()
	if !errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("abstract socket @%s: %w", Name, err)
	}
	squatter, err := socketHeld(netnsPath, k)
	if err != nil {
		return nil, err
	}
	return &Lock{Squatted: fmt.Sprintf("the start-up lock, abstract socket @%s, is held by %s, so not by a kube-nftproxy: "+
		"starting without it (on kernels before 5.12 any process can take it); stop that process", Name, squatter)}, nil
}

// listenOn starts answering challenges on l, once the answers' table could
// be written: without CAP_NET_ADMIN it cannot, as the proxy could not run.
func listenOn(l *net.UnixListener, k *nftlib.Kernel) (*Lock, error) {
	if err := writeAnswer(k, nil); err != nil {
		l.Close()
		k.Close()
		return nil, fmt.Errorf("creating table %s %s: %w", TableFamily, AnswersTable, err)
	}
	sl := &socketListener{l: l, k: k, done: make(chan struct{})}
	go sl.serve()
	return &Lock{listener: sl}, nil
}

// serve answers the connections one at a time, until the listener closes.
// Every connection is taken: left in the queue, they would fill it (at
// the listen backlog), and then no one could ask.
func (s *socketListener) serve() {
	defer close(s.done)
	for {
		c, err := s.l.Accept()
		if err != nil {
			return // closed by Release
		}
		s.answer(c)
		c.Close()
		time.Sleep(answerPause)
	}
}

// answer reads a challenge's nonce and answers it in the kernel, then says
// so with one byte.
func (s *socketListener) answer(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(answerTimeout))
	nonce := make([]byte, challengeLen)
	if _, err := io.ReadFull(c, nonce); err != nil {
		return
	}
	if writeAnswer(s.k, nonce) == nil {
		_, _ = c.Write([]byte{1})
	}
}

// writeAnswer makes the answers' table hold the chain of nonce alone (no
// chain for nil) in one transaction, whether the table exists or not.
func writeAnswer(k *nftlib.Kernel, nonce []byte) error {
	b := k.NewTx()
	b.AddTable(TableFamily, AnswersTable, "")
	b.DelTable(TableFamily, AnswersTable)
	b.AddTable(TableFamily, AnswersTable, "")
	if nonce != nil {
		b.AddChains(TableFamily, AnswersTable, []*nftlib.Chain{{Name: answerChain(nonce)}})
	}
	err := k.CommitTx(b)
	return err
}

func answerChain(nonce []byte) string { return "answer-" + hex.EncodeToString(nonce) }

// close stops answering and deletes the answers' table.
func (s *socketListener) close() error {
	err := s.l.Close()
	<-s.done
	b := s.k.NewTx()
	b.DelTable(TableFamily, AnswersTable)
	_ = s.k.CommitTx(b) // already gone: nothing to do
	return errors.Join(err, s.k.Close())
}

// socketHeld finds out who holds the abstract socket: ErrRunning naming
// it when it is a kube-nftproxy (it has CAP_NET_ADMIN as far as our pid
// namespace shows, and answers the challenge); else it names the squatter.
func socketHeld(netnsPath string, k *nftlib.Kernel) (squatter string, err error) {
	fd, cred, err := connectHolder(netnsPath)
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return "a process that accepts no connections", nil
	case err != nil:
		return "", fmt.Errorf("%w (the abstract socket @%s is bound; asking its holder: %w)", ErrRunning, Name, err)
	}
	defer unix.Close(fd)
	holder := "a process in another pid namespace"
	if cred.Pid != 0 {
		holder = fmt.Sprintf("pid %d (uid %d)", cred.Pid, cred.Uid)
		if has, known := hasCapNetAdmin(int(cred.Pid)); known && !has {
			return holder + ", which has no CAP_NET_ADMIN", nil
		}
	}
	proven, err := challenge(fd, k)
	if err != nil {
		return "", fmt.Errorf("challenging the holder of @%s: %w", Name, err)
	}
	if !proven {
		return holder + ", which did not answer as a kube-nftproxy does", nil
	}
	return "", fmt.Errorf("%w (%s, which holds the abstract socket @%s)", ErrRunning, holder, Name)
}

// connectHolder connects to the lock and asks the kernel for its owner's
// credentials (its pid as our pid namespace numbers it, 0 outside it).
func connectHolder(netnsPath string) (int, *unix.Ucred, error) {
	fd := -1
	err := netns.Do(netnsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		return err
	})
	if err != nil {
		return -1, nil, err
	}
	// Non-blocking: a holder whose queue is full (one that never
	// accepts) makes us wait for nothing.
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + Name}); err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, cred, nil
}

// challenge sends a nonce on the connection fd and reports whether the
// holder wrote its chain into the answers' table within answerTimeout.
func challenge(fd int, k *nftlib.Kernel) (bool, error) {
	nonce := make([]byte, challengeLen)
	_, _ = rand.Read(nonce)
	if n, err := unix.Write(fd, nonce); err != nil || n != len(nonce) {
		return false, nil // the holder hung up or takes nothing: no proxy
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(answerTimeout); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		if n > 0 {
			break
		}
	}
	chain := answerChain(nonce)
	tables, err := k.ReadFamily(TableFamily, []string{AnswersTable}, map[string][]string{AnswersTable: {chain}})
	if err != nil {
		return false, err
	}
	kt := tables[AnswersTable]
	return kt != nil && kt.Exists && kt.Chains[chain] != nil, nil
}

// hasCapNetAdmin reads whether process pid has CAP_NET_ADMIN in effect;
// known is false when its status cannot be read.
func hasCapNetAdmin(pid int) (has, known bool) {
	return statusHasCapNetAdmin(fmt.Sprintf("/proc/%d/status", pid))
}

// statusHasCapNetAdmin reads CAP_NET_ADMIN from a /proc status file.
func statusHasCapNetAdmin(path string) (has, known bool) {
	status, err := os.ReadFile(path)
	if err != nil {
		return false, false
	}
	for line := range strings.Lines(string(status)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&(1<<unix.CAP_NET_ADMIN) != 0, err == nil
		}
	}
	return false, false
}
