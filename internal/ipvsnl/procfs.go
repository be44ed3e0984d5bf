package ipvsnl

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// parseProcIPVS reads /proc/net/ip_vs: every real server of every
// service with weights and connection counts in one read, where netlink
// needs a dump per service. Services we never create (firewall marks,
// other protocols) are skipped with their real servers.
func parseProcIPVS(r io.Reader) (map[ServiceKey][]Dest, error) {
	out := map[ServiceKey][]Dest{}
	var cur *ServiceKey
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		f := strings.Fields(line)
		if n <= 3 || len(f) == 0 {
			continue // the three heading lines
		}
		if f[0] == "->" {
			if cur == nil {
				continue
			}
			if len(f) < 6 {
				return nil, fmt.Errorf("/proc/net/ip_vs line %d: %q", n, line)
			}
			ap, err := procAddrPort(f[1])
			if err != nil {
				return nil, fmt.Errorf("/proc/net/ip_vs line %d: %w", n, err)
			}
			var nums [3]uint32
			for i := range nums {
				v, err := strconv.ParseInt(f[3+i], 10, 64)
				if err != nil || v < 0 {
					return nil, fmt.Errorf("/proc/net/ip_vs line %d: bad number %q", n, f[3+i])
				}
				nums[i] = uint32(v)
			}
			out[*cur] = append(out[*cur], Dest{Addr: ap, Fwd: procFwd(f[2]), Weight: nums[0], Active: nums[1], Inactive: nums[2]})
			continue
		}
		cur = nil
		p, err := model.ParseProtocol(f[0])
		if err != nil || len(f) < 2 {
			continue // FWM, AH, ESP
		}
		ap, err := procAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("/proc/net/ip_vs line %d: %w", n, err)
		}
		cur = &ServiceKey{Addr: ap.Addr(), Protocol: p, Port: ap.Port()}
		out[*cur] = out[*cur][:0:0]
	}
	return out, sc.Err()
}

// procAddrPort reads "0A60000A:0050" (IPv4 as one hex number) or
// "[fd00:0000:…:0001]:0050".
func procAddrPort(s string) (netip.AddrPort, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q", s)
	}
	host := s[:i]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		if err != nil {
			return netip.AddrPort{}, err
		}
		return netip.AddrPortFrom(a, uint16(port)), nil
	}
	b, err := hex.DecodeString(host)
	if err != nil || len(b) != 4 {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b)), uint16(port)), nil
}

func procFwd(name string) uint32 {
	switch name {
	case "Tunnel":
		return FwdTunnel
	case "Route":
		return FwdRoute
	case "Local":
		return 1
	}
	return FwdMasq
}
