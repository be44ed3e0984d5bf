// Package instance keeps one kube-nftproxy per network namespace: two would
// rewrite each other's tables at every sync.
//
// The lock is an empty nftables table, `ip kube-nftproxy-lock`, created
// with NFT_TABLE_F_OWNER on a netlink socket that stays open while the
// process runs. Only a process with CAP_NET_ADMIN in the namespace can
// create it, as only such a process can run a proxy; no other process can
// change or delete it; and the kernel deletes it when that socket closes,
// however the process ends, so no lock is ever left behind. Two proxies in
// different containers of one hostNetwork node share it, as they share
// the network namespace (a file under /run would not be shared).
//
// Kernels before 5.12 have no owned tables: there the lock is the abstract
// unix socket @kube-nftproxy, which also goes with its process but which
// any process of the namespace can bind first.
package instance

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// TableFamily and TableName name the lock's table.
const (
	TableFamily = nftlib.IPv4
	TableName   = "kube-nftproxy-lock"
)

// Name is the abstract unix socket that marks a running instance on
// kernels without owned tables (before 5.12).
const Name = "kube-nftproxy"

// Lock is held while the process runs.
type Lock struct {
	kernel   *nftlib.Kernel    // the socket that owns the lock table; nil with the abstract socket
	listener *net.UnixListener // the abstract socket; nil with the table
}

// ErrRunning is returned by Acquire when another instance holds the lock.
var ErrRunning = errors.New("another kube-nftproxy is running in this network namespace")

// errNoOwnedTables: the kernel refused NFT_TABLE_F_OWNER (before 5.12).
var errNoOwnedTables = errors.New("this kernel has no owned nftables tables")

// Acquire takes the lock of the current network namespace, or says which
// process holds it. Without CAP_NET_ADMIN it fails with a permission
// error (errors.Is os.ErrPermission), as the proxy would later.
func Acquire() (*Lock, error) { return acquire("") }

// acquire takes the lock of the network namespace at netnsPath ("" for
// the current one).
func acquire(netnsPath string) (*Lock, error) {
	l, err := acquireTable(netnsPath)
	if errors.Is(err, errNoOwnedTables) {
		return acquireSocket(netnsPath)
	}
	return l, err
}

// tableComment says, in `nft list ruleset`, what the table is and who
// holds it; tableHolder reads the pid back.
func tableComment(pid int) string {
	return fmt.Sprintf("kube-nftproxy instance lock, held by pid %d: one proxy per network namespace; deleted when it exits", pid)
}

var commentPid = regexp.MustCompile(`held by pid (\d+)`)

// acquireTable creates the lock table on a socket of its own. A holder
// that exits between our attempt and our look at its table is retried.
func acquireTable(netnsPath string) (*Lock, error) {
	k, err := nftlib.OpenKernel(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	const attempts = 3
	for range attempts {
		b := k.NewBatch()
		b.AddOwnedTable(TableFamily, TableName, tableComment(os.Getpid()))
		err = k.Apply(b)
		switch {
		case err == nil:
			return &Lock{kernel: k}, nil
		case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL):
			// 5.12+ answers an unknown table flag with EOPNOTSUPP, 5.10 with EINVAL.
			k.Close()
			return nil, fmt.Errorf("%w: %w", errNoOwnedTables, err)
		case !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EPERM):
			k.Close()
			return nil, fmt.Errorf("creating table %s %s: %w", TableFamily, TableName, err)
		}
		// Held by another socket, or no CAP_NET_ADMIN: reading tells.
		gone, readErr := tableHolder(k)
		if errors.Is(readErr, os.ErrPermission) {
			k.Close()
			return nil, fmt.Errorf("creating table %s %s: %w", TableFamily, TableName, err)
		}
		if !gone {
			k.Close()
			return nil, readErr
		}
	}
	k.Close()
	return nil, fmt.Errorf("%w (table %s %s came and went %d times)", ErrRunning, TableFamily, TableName, attempts)
}

// tableHolder reads the lock table that exists: ErrRunning naming its
// holder, or gone when it was deleted meanwhile.
func tableHolder(k *nftlib.Kernel) (gone bool, err error) {
	kt, err := k.TableInfo(TableFamily, TableName)
	if err != nil {
		return false, fmt.Errorf("reading table %s %s: %w", TableFamily, TableName, err)
	}
	switch {
	case !kt.Exists:
		return true, nil
	case kt.Flags&nftlib.NftTableFOwner == 0:
		// Only a process with CAP_NET_ADMIN makes such a table (nft -f
		// with a copied ruleset, say); it goes with no process.
		return false, fmt.Errorf("table %s %s exists without an owner, so it is nobody's lock: "+
			"delete it (nft delete table %s %s) and start again", TableFamily, TableName, TableFamily, TableName)
	}
	if m := commentPid.FindStringSubmatch(kt.Comment()); m != nil {
		pid, _ := strconv.Atoi(m[1])
		return false, fmt.Errorf("%w (pid %d, which holds table %s %s)", ErrRunning, pid, TableFamily, TableName)
	}
	return false, fmt.Errorf("%w (netlink port id %d holds table %s %s)", ErrRunning, kt.Owner, TableFamily, TableName)
}

// acquireSocket listens on the abstract socket, on kernels without owned
// tables.
func acquireSocket(netnsPath string) (*Lock, error) {
	var l *net.UnixListener
	err := netns.Do(netnsPath, func() (err error) {
		l, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@" + Name, Net: "unix"})
		return err
	})
	if err == nil {
		go acceptAndClose(l)
		return &Lock{listener: l}, nil
	}
	if !errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("abstract socket @%s: %w", Name, err)
	}
	return nil, socketHeld(netnsPath, &unix.SockaddrUnix{Name: "@" + Name})
}

// acceptAndClose takes the connections of other instances asking who
// holds the lock: left in the queue, they would fill it in the end (at
// the listen backlog), and then no one could ask.
func acceptAndClose(l *net.UnixListener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return // closed by Release
		}
		c.Close()
	}
}

// socketHeld says who holds the abstract socket: ErrRunning naming its
// pid, unless the holder is certainly no kube-nftproxy (every version
// listens on it, and runs with CAP_NET_ADMIN), which is then named as the
// squatter to stop. A holder in another pid namespace cannot be judged.
func socketHeld(netnsPath string, addr *unix.SockaddrUnix) error {
	const squatted = "the start-up lock, abstract socket @%s, is held by %s, so not by a kube-nftproxy: " +
		"on kernels before 5.12 (no owned nftables tables) any process can take it; stop that process"
	cred, err := socketHolder(netnsPath, addr)
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return fmt.Errorf(squatted, Name, "a process that accepts no connections")
	case err != nil || cred.Pid == 0:
		return fmt.Errorf("%w (the abstract socket @%s is bound)", ErrRunning, Name)
	}
	if has, known := hasCapNetAdmin(int(cred.Pid)); known && !has {
		return fmt.Errorf(squatted, Name, fmt.Sprintf("pid %d (uid %d), which has no CAP_NET_ADMIN", cred.Pid, cred.Uid))
	}
	return fmt.Errorf("%w (pid %d, which holds the abstract socket @%s)", ErrRunning, cred.Pid, Name)
}

// socketHolder connects to the lock and asks the kernel for its owner's
// credentials (its pid as our pid namespace numbers it, 0 outside it).
func socketHolder(netnsPath string, addr *unix.SockaddrUnix) (*unix.Ucred, error) {
	fd := -1
	err := netns.Do(netnsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// Non-blocking: a holder whose queue is full (one that never
	// accepts) makes us wait for nothing.
	if err := unix.Connect(fd, addr); err != nil {
		return nil, err
	}
	return unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
}

// hasCapNetAdmin reads whether process pid has CAP_NET_ADMIN in effect;
// known is false when its status cannot be read.
func hasCapNetAdmin(pid int) (has, known bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
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

// Release gives the lock up: closing the owner's socket deletes the table.
func (l *Lock) Release() error {
	if l.kernel != nil {
		return l.kernel.Close()
	}
	return l.listener.Close()
}
