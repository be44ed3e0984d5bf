// Package sysctl reads and writes /proc/sys keys with errors that name the
// key and the reason. It is built in a later milestone.
package sysctl
