package ipvs

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// WriteRules writes virtual servers as `ipvsadm -Sn` prints them: one -A
// line per service, then one -a line per real server.
func WriteRules(w io.Writer, vss []ipvsnl.VirtualServer) error {
	var b strings.Builder
	for _, v := range vss {
		svc := serviceArg(v.ServiceKey)
		fmt.Fprintf(&b, "-A %s -s %s", svc, v.Scheduler)
		if f := schedFlags(v.Scheduler, v.Flags); f != "" {
			b.WriteString(" -b " + f)
		}
		if v.Flags&ipvsnl.FlagPersistent != 0 {
			fmt.Fprintf(&b, " -p %d", v.Timeout)
			if v.Addr.Is4() && v.Netmask != 0xffffffff {
				fmt.Fprintf(&b, " -M %d.%d.%d.%d", v.Netmask>>24, v.Netmask>>16&0xff, v.Netmask>>8&0xff, v.Netmask&0xff)
			} else if v.Addr.Is6() && v.Netmask != 128 {
				fmt.Fprintf(&b, " -M %d", v.Netmask)
			}
		}
		b.WriteByte('\n')
		for _, d := range v.Dests {
			fmt.Fprintf(&b, "-a %s -r %s %s -w %d\n", svc, addrPort(d.Addr.Addr(), d.Addr.Port()), fwdArg(d.Fwd), d.Weight)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func serviceArg(k ipvsnl.ServiceKey) string {
	opt := "-t"
	switch k.Protocol {
	case model.UDP:
		opt = "-u"
	case model.SCTP:
		opt = "--sctp-service"
	}
	return opt + " " + addrPort(k.Addr, k.Port)
}

func addrPort(a netip.Addr, port uint16) string {
	return netip.AddrPortFrom(a, port).String() // [v6]:port, as ipvsadm
}

func fwdArg(fwd uint32) string {
	switch fwd & ipvsnl.FwdMask {
	case ipvsnl.FwdTunnel:
		return "-i"
	case ipvsnl.FwdRoute:
		return "-g"
	}
	return "-m"
}

// schedFlags spells the scheduler flags as ipvsadm -b takes them.
func schedFlags(sched string, flags uint32) string {
	names := [3]string{"flag-1", "flag-2", "flag-3"}
	switch sched {
	case "sh", "mh":
		names = [3]string{sched + "-fallback", sched + "-port", "flag-3"}
	}
	var out []string
	for i, bit := range []uint32{0x8, 0x10, 0x20} {
		if flags&bit != 0 {
			out = append(out, names[i])
		}
	}
	return strings.Join(out, ",")
}

// WriteAddrs writes kube-ipvs0's addresses, one prefix per line.
func WriteAddrs(w io.Writer, addrs []netip.Addr) error {
	var b strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&b, "%s\n", netip.PrefixFrom(a, a.BitLen()))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteElements writes helper set elements as "SET-NAME family key" lines.
func WriteElements(w io.Writer, elems []Element) error {
	var b strings.Builder
	for _, e := range elems {
		fam := "ip"
		if e.V6 {
			fam = "ip6"
		}
		fmt.Fprintf(&b, "%s %s %s\n", e.Set, fam, e)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// String renders the whole plan: virtual servers, kube-ipvs0 addresses and
// helper set elements, each under a heading.
func (p *Plan) String() string {
	var b strings.Builder
	b.WriteString("# virtual servers (ipvsadm -Sn)\n")
	_ = WriteRules(&b, p.VirtualServers())
	b.WriteString("# kube-ipvs0 addresses\n")
	_ = WriteAddrs(&b, p.Addrs())
	b.WriteString("# helper set elements\n")
	_ = WriteElements(&b, p.Elements())
	return b.String()
}
