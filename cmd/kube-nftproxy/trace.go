package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

func newTraceCommand() *cobra.Command {
	o := &options{}
	var src, dst, iif string
	var fromNode bool
	cmd := &cobra.Command{
		Use:   "trace --src IP --dst IP:PORT[/PROTO] [--from-node]",
		Short: "show what our rules do with the first packet of a connection: the chains it goes through, the verdict, each DNAT target with its probability, masquerading",
		Long: `trace follows the first packet of a new connection through kube-nftproxy's
tables in this network namespace (or, with --state, through what kube-nftproxy would
program for those objects), the way the kernel would: filter before DNAT, DNAT,
filter after it, SNAT. Every random choice among endpoints is followed, so each
possible DNAT target is printed with its probability. --from-node traces a
connection the node itself opens (the output hook) instead of one arriving on
or passing through it. The node's addresses (for NodePorts) are this namespace's,
or with --state those of the Node object. With --state it assumes the mode and
settings the proxy would run with (--proxy-mode, --config: an empty mode is
iptables mode, as kube-proxy's) and says which. A client is assumed to have no
session affinity yet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := parsePacket(src, dst, iif, fromNode)
			if err != nil {
				return err
			}
			if err := o.completeRuleCommand(cmd.Flags(), "state", "src", "dst", "iif", "from-node"); err != nil {
				return err
			}
			if o.statePath != "" {
				if o.modeName() == modeIPVS {
					return errors.New("trace follows the rules of iptables and nftables mode; IPVS mode's virtual servers are not traced (render --proxy-mode ipvs prints them)")
				}
				fmt.Fprintf(cmd.OutOrStdout(), "mode: %s\n", o.assumedMode())
			}
			rs, local, err := traceRuleset(o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			p.Local = local
			outcomes, err := rs.Trace(p)
			if err != nil {
				return err
			}
			return writeTrace(cmd.OutOrStdout(), p, outcomes, baseChains(rs, p))
		},
	}
	cmd.Flags().StringVar(&src, "src", "", "the packet's source address")
	cmd.Flags().StringVar(&dst, "dst", "", "the packet's destination, IP:PORT[/PROTO] (tcp, udp or sctp; default tcp); [IPv6]:PORT")
	cmd.Flags().StringVar(&iif, "iif", "", "the interface the packet comes in on (for --detect-local-mode BridgeInterface/InterfaceNamePrefix)")
	cmd.Flags().BoolVar(&fromNode, "from-node", false, "the node itself opens the connection (output hook)")
	o.addRuleCommandFlags(cmd.Flags(), "iptables or nftables; with --state")
	return cmd
}

func parsePacket(src, dst, iif string, fromNode bool) (nftlib.Packet, error) {
	var p nftlib.Packet
	if src == "" || dst == "" {
		return p, errors.New("trace needs --src and --dst")
	}
	s, err := netip.ParseAddr(src)
	if err != nil {
		return p, fmt.Errorf("--src: %w", err)
	}
	dstAddr, proto, _ := strings.Cut(dst, "/")
	ap, err := netip.ParseAddrPort(dstAddr)
	if err != nil {
		return p, fmt.Errorf("--dst %q: want IP:PORT[/PROTO]: %w", dst, err)
	}
	if s.Unmap().Is4() != ap.Addr().Unmap().Is4() {
		return p, fmt.Errorf("--src %s and --dst %s are of different IP families", src, dst)
	}
	p = nftlib.Packet{Src: s.Unmap(), Dst: ap.Addr().Unmap(), Dport: ap.Port(), Output: fromNode, Iif: iif}
	switch strings.ToLower(proto) {
	case "", "tcp":
		p.Proto = unix.IPPROTO_TCP
	case "udp":
		p.Proto = unix.IPPROTO_UDP
	case "sctp":
		p.Proto = unix.IPPROTO_SCTP
	default:
		return p, fmt.Errorf("--dst %q: protocol %q: want tcp, udp or sctp", dst, proto)
	}
	return p, nil
}

// traceRuleset is the ruleset to trace through and the node's addresses:
// the render of --state and its Node's addresses, or the live tables and
// this namespace's addresses.
func traceRuleset(o *options, stderr io.Writer) (*nftlib.Ruleset, []netip.Addr, error) {
	if o.statePath != "" {
		st, err := loadState(o, klogSlog())
		if err != nil {
			return nil, nil, err
		}
		cfg, err := o.nftConfig()
		if err != nil {
			return nil, nil, err
		}
		return nft.Build(st, cfg), st.Node.IPs, nil
	}
	rs, err := oursFor(o, stderr)
	if err != nil {
		return nil, nil, err
	}
	local, err := netns.Addrs()
	if err != nil {
		return nil, nil, fmt.Errorf("reading this namespace's addresses: %w", err)
	}
	return rs, local, nil
}

// writeTrace prints each way the packet can go, once (ways that differ
// only in a choice that changed nothing are added up), then a summary: the
// verdict(s), the DNAT targets with their probabilities, masquerading.
func writeTrace(w io.Writer, p nftlib.Packet, outs []nftlib.Outcome, base map[[2]string]bool) error {
	hook := "arriving at or passing through the node"
	if p.Output {
		hook = "sent by the node"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "packet: %s %s -> %s (%s)\n", nftlib.ProtoName(p.Proto), p.Src, netip.AddrPortFrom(p.Dst, p.Dport), hook)
	targets := map[string]float64{}
	verdicts := map[string]float64{}
	masq := 0.0
	paths, probs := map[string]int{}, []float64{}
	var texts []string
	for _, o := range outs {
		v := outcomeVerdict(o)
		text := pathText(p, o, v, base)
		if i, ok := paths[text]; ok {
			probs[i] += o.Prob
		} else {
			paths[text] = len(texts)
			texts, probs = append(texts, text), append(probs, o.Prob)
		}
		if o.DNAT.IsValid() {
			targets[o.DNAT.String()] += o.Prob
		}
		if !o.Dropped && o.Masquerade {
			masq += o.Prob
		}
		verdicts[v] += o.Prob
	}
	for i, text := range texts {
		fmt.Fprintf(&b, "path %d (%s): %s", i+1, percent(probs[i]), text)
	}
	fmt.Fprintf(&b, "verdict: %s\n", weighted(verdicts))
	switch {
	case len(targets) > 0:
		fmt.Fprintf(&b, "dnat targets: %s\n", weighted(targets))
	case len(verdicts) == 1 && verdicts["accept"] > 0:
		fmt.Fprintf(&b, "dnat targets: none: no Service port holds %s/%s, so the proxy's rules leave it alone\n",
			netip.AddrPortFrom(p.Dst, p.Dport), nftlib.ProtoName(p.Proto))
	default:
		b.WriteString("dnat targets: none (not DNATed)\n")
	}
	switch {
	case masq == 0:
		b.WriteString("masquerade: no\n")
	case masq > 1-1e-9:
		b.WriteString("masquerade: yes\n")
	default:
		fmt.Fprintf(&b, "masquerade: %s of the time\n", percent(masq))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// pathText is one way through: what happened, then each table's part,
// one line each.
func pathText(p nftlib.Packet, o nftlib.Outcome, verdict string, base map[[2]string]bool) string {
	var b strings.Builder
	b.WriteString(verdict)
	if o.DNAT.IsValid() {
		fmt.Fprintf(&b, ", dnat to %s", o.DNAT)
	}
	if !o.Dropped {
		if o.Masquerade {
			b.WriteString(", source masqueraded")
		} else {
			b.WriteString(", source kept")
		}
	}
	b.WriteString("\n")
	family := "ip"
	if p.Dst.Is6() {
		family = "ip6"
	}
	for _, s := range segments(o, base) {
		fmt.Fprintf(&b, "    %s %s: %s\n", family, strings.Join(s.tables, ", "), strings.Join(s.chains, " > "))
	}
	return b.String()
}

// segment is a part of a path in one table, from a base chain on; the
// same part in several tables one after the other (the affinity and delta
// tables, which had nothing for the packet, then the main table) is one
// segment naming them all.
type segment struct {
	tables []string
	chains []string
}

func segments(o nftlib.Outcome, base map[[2]string]bool) []segment {
	var parts []segment
	for i, c := range o.Chains {
		t := ""
		if i < len(o.Tables) {
			t = o.Tables[i]
		}
		if n := len(parts); n == 0 || parts[n-1].tables[0] != t || base[[2]string{t, c}] {
			parts = append(parts, segment{tables: []string{t}})
		}
		parts[len(parts)-1].chains = append(parts[len(parts)-1].chains, c)
	}
	var out []segment
	for _, s := range parts {
		if n := len(out); n > 0 && slices.Equal(out[n-1].chains, s.chains) {
			out[n-1].tables = append(out[n-1].tables, s.tables...)
			continue
		}
		out = append(out, s)
	}
	return out
}

// baseChains are the base chains of the packet's family, by table.
func baseChains(rs *nftlib.Ruleset, p nftlib.Packet) map[[2]string]bool {
	f := nftlib.IPv4
	if p.Dst.Is6() {
		f = nftlib.IPv6
	}
	base := map[[2]string]bool{}
	for _, t := range rs.Tables {
		if t.Family != f {
			continue
		}
		for _, c := range t.Chains {
			if c.Hook != nil {
				base[[2]string{t.Name, c.Name}] = true
			}
		}
	}
	return base
}

func outcomeVerdict(o nftlib.Outcome) string {
	switch {
	case o.Rejected:
		return "reject"
	case o.Dropped:
		return "drop"
	}
	return "accept"
}

func weighted(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		if len(m) == 1 && m[k] > 1-1e-9 {
			parts = append(parts, k)
			continue
		}
		parts = append(parts, k+" "+percent(m[k]))
	}
	return strings.Join(parts, ", ")
}

func percent(p float64) string { return strconv.FormatFloat(100*p, 'g', 4, 64) + "%" }
