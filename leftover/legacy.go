package leftover

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// Legacy is upstream kube-proxy's chains in one iptables-legacy table.
// Legacy tables are x_tables, which nftables' netlink cannot change; they
// can only be reported, with the command that removes them.
type Legacy struct {
	Family string // "ip" or "ip6"
	Table  string // "nat", "filter", "mangle"
	Chains []string
}

// legacyFamily is what differs between iptables-legacy and ip6tables-legacy.
type legacyFamily struct {
	name   string
	names  string // the /proc/net file listing the loaded tables
	domain int
	level  int
	// targetOffset is where ipt_entry/ip6t_entry keep target_offset
	// (next_offset follows): after struct ipt_ip (84 bytes) and nfcache,
	// or struct ip6t_ip6 (136 bytes) and nfcache.
	targetOffset int
}

var legacyFamilies = []legacyFamily{
	{name: "ip", names: "ip_tables_names", domain: unix.AF_INET, level: unix.SOL_IP, targetOffset: 88},
	{name: "ip6", names: "ip6_tables_names", domain: unix.AF_INET6, level: unix.SOL_IPV6, targetOffset: 140},
}

// x_tables' getsockopt interface (linux/netfilter_ipv4/ip_tables.h; ip6
// uses the same numbers and layouts).
const (
	soGetInfo    = 64 // IPT_SO_GET_INFO
	soGetEntries = 65 // IPT_SO_GET_ENTRIES
	tableNameLen = 32 // XT_TABLE_MAXNAMELEN
	// struct ipt_getinfo: name, valid_hooks, hook_entry[5], underflow[5],
	// num_entries, size.
	getInfoLen    = tableNameLen + 4 + 5*4 + 5*4 + 4 + 4
	getInfoSize   = getInfoLen - 4
	entriesHeader = 40 // struct ipt_get_entries up to entrytable (8-aligned)
	// struct xt_entry_target: target_size, name[29], revision.
	targetHeader = 32
)

// scanLegacy reads kube-proxy's chains in the iptables-legacy tables that
// are loaded in the network namespace at netnsPath ("" the current one).
// It never loads a table: a table not listed in /proc/net/ip_tables_names
// is not asked for (asking would create it).
func scanLegacy(netnsPath string) ([]Legacy, error) {
	var out []Legacy
	err := netns.Do(netnsPath, func() error {
		for _, fam := range legacyFamilies {
			loaded, err := loadedLegacyTables(fam.names)
			if err != nil {
				return err
			}
			for _, t := range iptablesTables {
				if !slices.Contains(loaded, t) {
					continue
				}
				blob, err := legacyEntries(fam, t)
				if err != nil {
					return fmt.Errorf("reading %s-legacy table %s: %w", fam.name, t, err)
				}
				var kube []string
				for _, c := range legacyChains(blob, fam.targetOffset) {
					if isKubeProxyChain(t, c) {
						kube = append(kube, c)
					}
				}
				if len(kube) > 0 {
					slices.Sort(kube)
					out = append(out, Legacy{Family: fam.name, Table: t, Chains: kube})
				}
			}
		}
		return nil
	})
	return out, err
}

// loadedLegacyTables reads /proc/net/ip_tables_names (or ip6's) of the
// calling thread's network namespace; a kernel without x_tables has none.
func loadedLegacyTables(file string) ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/net/" + file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// legacyEntries reads a loaded legacy table's entries, as iptables-save
// does: IPT_SO_GET_INFO for its size, then IPT_SO_GET_ENTRIES.
func legacyEntries(fam legacyFamily, table string) ([]byte, error) {
	fd, err := unix.Socket(fam.domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("opening a raw socket: %w", err)
	}
	defer unix.Close(fd)
	info := make([]byte, getInfoLen)
	copy(info, table)
	if err := getsockopt(fd, fam.level, soGetInfo, info); err != nil {
		return nil, fmt.Errorf("IPT_SO_GET_INFO: %w", err)
	}
	size := binary.NativeEndian.Uint32(info[getInfoSize:])
	// The table may grow between the two calls: the kernel then refuses
	// the second (EAGAIN); read again.
	for range 5 {
		buf := make([]byte, entriesHeader+int(size))
		copy(buf, table)
		binary.NativeEndian.PutUint32(buf[tableNameLen:], size)
		err := getsockopt(fd, fam.level, soGetEntries, buf)
		if err == nil {
			return buf[entriesHeader:], nil
		}
		if !errors.Is(err, unix.EAGAIN) {
			return nil, fmt.Errorf("IPT_SO_GET_ENTRIES: %w", err)
		}
		if err := getsockopt(fd, fam.level, soGetInfo, info); err != nil {
			return nil, fmt.Errorf("IPT_SO_GET_INFO: %w", err)
		}
		size = binary.NativeEndian.Uint32(info[getInfoSize:])
	}
	return nil, errors.New("the table kept changing while being read")
}

func getsockopt(fd, level, opt int, buf []byte) error {
	l := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// legacyChains returns the user-defined chains of a legacy table's
// entries: each starts with an entry whose target is ERROR with the
// chain's name as its data (the table's last entry is an ERROR named
// "ERROR", and is left out).
func legacyChains(blob []byte, targetOffset int) []string {
	var out []string
	for len(blob) >= targetOffset+4 {
		tOff := int(binary.NativeEndian.Uint16(blob[targetOffset:]))
		next := int(binary.NativeEndian.Uint16(blob[targetOffset+2:]))
		if next <= 0 || next > len(blob) || tOff+targetHeader > next {
			break
		}
		tgt := blob[tOff:next]
		if cstr(tgt[2:targetHeader-1]) == "ERROR" {
			if name := cstr(tgt[targetHeader:]); name != "ERROR" && name != "" {
				out = append(out, name)
			}
		}
		blob = blob[next:]
	}
	return out
}

// legacyCommand is what a log tells an operator to run to see and remove
// kube-proxy's iptables-legacy rules, which nothing over netlink can do.
func legacyCommand(l []Legacy) string {
	var see []string
	for _, f := range []string{"ip", "ip6"} {
		if slices.ContainsFunc(l, func(x Legacy) bool { return x.Family == f }) {
			see = append(see, f+"tables-legacy-save | grep -E -- '^:KUBE-|-j KUBE-'")
		}
	}
	return "see them with `" + strings.Join(see, "; ") + "`; remove them with upstream `kube-proxy --cleanup` " +
		"run with iptables-legacy (the kube-proxy image's iptables-wrapper picks legacy when the node's rules are there)"
}

// cstr is a NUL-terminated string in a fixed-size field.
func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
