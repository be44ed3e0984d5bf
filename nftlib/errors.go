package nftlib

import (
	"errors"
	"fmt"
)

// Errors a sync cannot fix by retrying at once: the caller should back off
// and report them. Match them with errors.Is; errors.As gives the details.
var (
	// ErrTableOwned: another process holds one of our tables with
	// NFT_TABLE_F_OWNER, so the kernel refuses every change to it from us.
	ErrTableOwned = errors.New("nftables table owned by another process")
	// ErrTxTooLarge: a transaction does not fit in the netlink socket's
	// send buffer, and the kernel would refuse it whole.
	ErrTxTooLarge = errors.New("nftables transaction larger than the socket send buffer")
	// ErrAnswersLost: the kernel dropped a transaction's answers (the
	// socket's receive queue overflowed, e.g. with an error for each of
	// thousands of refused messages): it may have been applied or not, and
	// only reading the state back tells.
	ErrAnswersLost = errors.New("the kernel dropped the transaction's answers (receive buffer full)")
)

// TableOwnedError names the table another process owns.
type TableOwnedError struct {
	Family Family
	Table  string
	Owner  uint32 // the owner's netlink port id (its pid for most programs)
}

func (e *TableOwnedError) Error() string {
	return fmt.Sprintf("table %s %s is owned by another process (netlink port id %d, NFT_TABLE_F_OWNER): "+
		"it cannot be changed until that process exits or deletes it", e.Family, e.Table, e.Owner)
}

func (e *TableOwnedError) Unwrap() error { return ErrTableOwned }

// WaitsForOtherProcess says that the refusal lasts until the owner exits,
// which the kernel announces to no one: the sync loop polls for it.
func (e *TableOwnedError) WaitsForOtherProcess() bool { return true }

// txTooLargeError says how large the transaction is, what the socket
// accepts and how to raise that; it is ErrTxTooLarge to errors.Is.
type txTooLargeError struct {
	Size  int // bytes of the transaction
	Limit int // the largest message the socket's send buffer takes
}

func (e *txTooLargeError) Error() string {
	return fmt.Sprintf("nftables transaction of %d bytes does not fit in the netlink send buffer (at most %d bytes): "+
		"run with CAP_NET_ADMIN (SO_SNDBUFFORCE) or raise net.core.wmem_max to at least %d", e.Size, e.Limit, e.Size)
}

func (e *txTooLargeError) Unwrap() error { return ErrTxTooLarge }
