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
// any process of the namespace can bind first. Its holder proves that it
// can run a proxy by answering a challenge with a change to nftables that
// only CAP_NET_ADMIN allows (see socket.go); a holder that cannot is a
// squatter, which the proxy names and starts without the lock beside.
package instance

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"

	"golang.org/x/sys/unix"

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
	kernel   *nftlib.Kernel  // the socket that owns the lock table; nil with the abstract socket
	listener *socketListener // the abstract socket; nil with the table
	// Squatted, when set, says why the process runs without the lock: the
	// abstract socket is held by a process that cannot run a proxy.
	Squatted string
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
		b := k.NewTx()
		b.AddOwnedTable(TableFamily, TableName, tableComment(os.Getpid()))
		err = k.CommitTx(b)
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

// Release gives the lock up: closing the owner's socket deletes the table;
// the abstract socket is closed and its answers' table deleted.
func (l *Lock) Release() error {
	switch {
	case l.kernel != nil:
		return l.kernel.Close()
	case l.listener != nil:
		return l.listener.close()
	}
	return nil
}
