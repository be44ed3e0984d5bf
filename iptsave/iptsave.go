// Package iptsave parses the output of iptables-save and ip6tables-save
// (legacy and nf_tables variants, with or without -c counters) into tables,
// chains and rules whose matches and targets are read into fields: what
// kube-proxy's iptables mode writes, and the rest kept as text so that a
// caller can tell it did not understand a rule.
package iptsave

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// Dump is one iptables-save output.
type Dump struct {
	// Tables by name ("nat", "filter", ...).
	Tables map[string]*Table
	// IPv6 is true for ip6tables-save output: told by its addresses, or
	// by the header line where there is none.
	IPv6 bool
}

// Table is one "*name ... COMMIT" block.
type Table struct {
	Name string
	// Chains in the order they were declared, built-in ones included.
	Chains []string
	// Policies of the built-in chains ("ACCEPT", "DROP"); "-" for others.
	Policies map[string]string
	// Rules by chain, in order.
	Rules map[string][]*Rule
}

// Has reports whether the table declares the chain.
func (t *Table) Has(chain string) bool {
	_, ok := t.Policies[chain]
	return ok
}

// Match is an address match: `[!] -s PREFIX`.
type Match struct {
	Prefix netip.Prefix
	Negate bool
}

// Valid reports whether the rule has this match.
func (m Match) Valid() bool { return m.Prefix.IsValid() }

// Recent is the `-m recent` match kube-proxy uses for session affinity:
// --set records the source, --rcheck --seconds N checks it was seen within N s.
type Recent struct {
	Name    string
	Set     bool
	Check   bool
	Seconds int
	Reap    bool
}

// Mark is `[!] -m mark --mark VALUE/MASK`.
type Mark struct {
	Value, Mask uint32
	Negate      bool
}

// Rule is one `-A CHAIN ...` line.
type Rule struct {
	Chain   string
	Src     Match
	Dst     Match
	Proto   string // lower case; "" for any
	Dport   int    // 0: any
	InIface string
	Comment string
	// SrcType and DstType are `-m addrtype --src-type/--dst-type`, with
	// "!" in front when negated.
	SrcType, DstType string
	// Probability is `-m statistic --mode random --probability P`; 0 when absent.
	Probability float64
	Recent      *Recent
	CtState     string // `-m conntrack --ctstate` / `-m state --state`, "!" in front when negated
	Mark        *Mark
	// Target is the -j (or -g, with Goto) target, "" for none.
	Target string
	Goto   bool
	// Target options: DNAT --to-destination, MARK --set-xmark (as
	// iptables-save prints --or-mark and --xor-mark), MASQUERADE
	// --random-fully, REJECT --reject-with.
	ToDestination string
	SetXMark      *Mark
	RandomFully   bool
	RejectWith    string
	// Other holds every option the parser does not interpret, as written.
	Other []string
	// Line is the rule as it was read (without counters).
	Line string
}

// Parse reads iptables-save output. It fails on text that is not
// iptables-save output: a rule or chain outside a table, a rule for a chain
// the table did not declare, an option without its value, or nothing at all.
func Parse(r io.Reader) (*Dump, error) {
	d := &Dump{Tables: map[string]*Table{}}
	var cur *Table
	sawV6Header, sawV4Addr, sawV6Addr := false, false, false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "#"):
			if strings.Contains(line, "ip6tables") {
				sawV6Header = true
			}
			continue
		case strings.HasPrefix(line, "*"):
			if cur != nil {
				return nil, fmt.Errorf("line %d: table %s begins before %s was committed", n, line[1:], cur.Name)
			}
			name := line[1:]
			cur = d.Tables[name]
			if cur == nil {
				cur = &Table{Name: name, Policies: map[string]string{}, Rules: map[string][]*Rule{}}
				d.Tables[name] = cur
			}
			continue
		case line == "COMMIT":
			if cur == nil {
				return nil, fmt.Errorf("line %d: COMMIT outside a table", n)
			}
			cur = nil
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: %q outside a table (not iptables-save output?)", n, trim(line))
		}
		if strings.HasPrefix(line, ":") {
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return nil, fmt.Errorf("line %d: bad chain line %q", n, line)
			}
			if _, ok := cur.Policies[f[0]]; !ok {
				cur.Chains = append(cur.Chains, f[0])
			}
			cur.Policies[f[0]] = f[1]
			continue
		}
		if strings.HasPrefix(line, "[") { // -c counters: [packets:bytes] -A ...
			i := strings.IndexByte(line, ']')
			if i < 0 {
				return nil, fmt.Errorf("line %d: unterminated counters in %q", n, trim(line))
			}
			line = strings.TrimSpace(line[i+1:])
		}
		words, err := split(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(words) < 2 || (words[0] != "-A" && words[0] != "--append") {
			return nil, fmt.Errorf("line %d: want -A CHAIN ..., got %q", n, trim(line))
		}
		rule, err := parseRule(words[1], words[2:])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if !cur.Has(rule.Chain) {
			return nil, fmt.Errorf("line %d: rule for chain %s, which table %s does not declare", n, rule.Chain, cur.Name)
		}
		rule.Line = line
		for _, m := range []Match{rule.Src, rule.Dst} {
			if m.Valid() {
				sawV4Addr = sawV4Addr || m.Prefix.Addr().Is4()
				sawV6Addr = sawV6Addr || m.Prefix.Addr().Is6()
			}
		}
		cur.Rules[rule.Chain] = append(cur.Rules[rule.Chain], rule)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	if cur != nil {
		return nil, fmt.Errorf("table %s is not committed (truncated output?)", cur.Name)
	}
	if len(d.Tables) == 0 {
		return nil, fmt.Errorf("no tables: not iptables-save output")
	}
	switch {
	case sawV4Addr && sawV6Addr:
		return nil, fmt.Errorf("both IPv4 and IPv6 addresses: give iptables-save and ip6tables-save output separately")
	case sawV6Addr:
		d.IPv6 = true
	case !sawV4Addr:
		d.IPv6 = sawV6Header
	}
	return d, nil
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// split breaks a rule line into words as iptables-save quotes them: double
// quotes around words with spaces, backslash escapes inside them.
func split(line string) ([]string, error) {
	var words []string
	var b strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			b.WriteByte(line[i])
		case c == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (c == ' ' || c == '\t'):
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", trim(line))
	}
	if inWord {
		words = append(words, b.String())
	}
	return words, nil
}

// parseRule reads the words after "-A CHAIN".
func parseRule(chain string, w []string) (*Rule, error) {
	r := &Rule{Chain: chain}
	negate := false
	for i := 0; i < len(w); i++ {
		opt := w[i]
		if opt == "!" {
			negate = true
			continue
		}
		value := func() (string, error) {
			if i+1 >= len(w) {
				return "", fmt.Errorf("%s without a value", opt)
			}
			i++
			return w[i], nil
		}
		neg := negate
		negate = false
		bang := ""
		if neg {
			bang = "!"
		}
		var v string
		var err error
		switch opt {
		case "-s", "--source", "-d", "--destination":
			if v, err = value(); err != nil {
				return nil, err
			}
			p, perr := parsePrefix(v)
			if perr != nil {
				return nil, fmt.Errorf("%s %q: %w", opt, v, perr)
			}
			if opt == "-s" || opt == "--source" {
				r.Src = Match{Prefix: p, Negate: neg}
			} else {
				r.Dst = Match{Prefix: p, Negate: neg}
			}
		case "-p", "--protocol":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.Proto = bang + strings.ToLower(v)
		case "--dport", "--destination-port":
			if v, err = value(); err != nil {
				return nil, err
			}
			port, perr := strconv.ParseUint(v, 10, 16)
			if perr != nil || neg {
				r.Other = append(r.Other, bang+opt, v) // a range or a negation: not kube-proxy's
				break
			}
			r.Dport = int(port)
		case "-i", "--in-interface":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.InIface = bang + v
		case "-m", "--match":
			if v, err = value(); err != nil {
				return nil, err
			}
			switch v {
			case "comment", "tcp", "udp", "sctp", "addrtype", "statistic", "recent", "conntrack", "state", "mark":
			default:
				r.Other = append(r.Other, opt, v)
			}
		case "--comment":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.Comment = v
		case "--src-type", "--dst-type":
			if v, err = value(); err != nil {
				return nil, err
			}
			if opt == "--src-type" {
				r.SrcType = bang + v
			} else {
				r.DstType = bang + v
			}
		case "--mode":
			if v, err = value(); err != nil {
				return nil, err
			}
			if v != "random" {
				r.Other = append(r.Other, opt, v)
			}
		case "--probability":
			if v, err = value(); err != nil {
				return nil, err
			}
			p, perr := strconv.ParseFloat(v, 64)
			if perr != nil || p < 0 || p > 1 {
				return nil, fmt.Errorf("--probability %q: want a number within 0-1", v)
			}
			r.Probability = p
		case "--name", "--seconds":
			if v, err = value(); err != nil {
				return nil, err
			}
			if r.Recent == nil {
				r.Recent = &Recent{}
			}
			if opt == "--name" {
				r.Recent.Name = v
			} else if r.Recent.Seconds, err = strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("--seconds %q: %w", v, err)
			}
		case "--set", "--rcheck", "--reap":
			if r.Recent == nil {
				r.Recent = &Recent{}
			}
			switch opt {
			case "--set":
				r.Recent.Set = true
			case "--rcheck":
				r.Recent.Check = true
			default:
				r.Recent.Reap = true
			}
		case "--rsource":
		case "--mask":
			if v, err = value(); err != nil {
				return nil, err
			}
			if v != "255.255.255.255" && v != "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" {
				r.Other = append(r.Other, opt, v)
			}
		case "--ctstate", "--state":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.CtState = bang + v
		case "--mark":
			if v, err = value(); err != nil {
				return nil, err
			}
			m, merr := parseMark(v)
			if merr != nil {
				return nil, fmt.Errorf("--mark: %w", merr)
			}
			m.Negate = neg
			r.Mark = &m
		case "-j", "--jump", "-g", "--goto":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.Target = v
			r.Goto = opt == "-g" || opt == "--goto"
		case "--to-destination":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.ToDestination = v
		case "--set-xmark", "--or-mark", "--xor-mark":
			if v, err = value(); err != nil {
				return nil, err
			}
			m, merr := parseMark(v)
			if merr != nil {
				return nil, fmt.Errorf("%s: %w", opt, merr)
			}
			switch opt {
			case "--or-mark": // iptables-save prints it as --set-xmark V/V
				m.Mask = m.Value
			case "--xor-mark": // ... and this as --set-xmark V/0
				m.Mask = 0
			}
			r.SetXMark = &m
		case "--random-fully":
			r.RandomFully = true
		case "--reject-with":
			if v, err = value(); err != nil {
				return nil, err
			}
			r.RejectWith = v
		default:
			r.Other = append(r.Other, bang+opt)
			// An option we do not know: keep its values too.
			for i+1 < len(w) && !strings.HasPrefix(w[i+1], "-") && w[i+1] != "!" {
				i++
				r.Other = append(r.Other, w[i])
			}
		}
	}
	return r, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseMark reads VALUE[/MASK] (hex or decimal); a missing mask is all ones.
func parseMark(s string) (Mark, error) {
	v, m, hasMask := strings.Cut(s, "/")
	value, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return Mark{}, fmt.Errorf("%q: %w", s, err)
	}
	mask := uint64(0xffffffff)
	if hasMask {
		if mask, err = strconv.ParseUint(m, 0, 32); err != nil {
			return Mark{}, fmt.Errorf("%q: %w", s, err)
		}
	}
	return Mark{Value: uint32(value), Mask: uint32(mask)}, nil
}
