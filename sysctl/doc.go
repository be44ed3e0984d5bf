// Package sysctl reads and writes kernel tunables that live in files:
// /proc/sys keys ("net/netfilter/nf_conntrack_max") and module parameters
// under /sys/module ("nf_conntrack/parameters/hashsize"), with errors that
// name the key and the reason.
//
// A key this kernel does not have gives an error wrapping fs.ErrNotExist;
// a key that cannot be written here (a read-only mount, a key the kernel
// makes read-only, as nf_conntrack_max in a network namespace other than the
// initial one, or one it refuses to change from here, as the conntrack
// hashsize outside the initial network namespace) gives one wrapping
// ErrReadOnly. Both are *Error values.
//
// The root directory is a parameter (New), so tests use a temporary
// directory; the package has no global state.
package sysctl
