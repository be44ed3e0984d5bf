// Package iptsave parses the output of iptables-save and ip6tables-save
// (legacy and nf_tables variants, with or without -c counters) into tables,
// chains and rules whose matches and targets are read into fields: what
// kube-proxy's iptables mode writes, and the rest kept as text so that a
// caller can tell it did not understand a rule.
package iptsave

import (
	"bufio"
	"errors"
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

// Limits bound what reading a dump may cost, so that a broken or hostile
// input (a binary file, a line without end, millions of tiny rules) fails
// with an error naming the limit instead of taking the machine's memory.
// Each limit is about twice what kube-proxy writes for 90,000 Services of
// 2 endpoints each (110 MB, 1 million chains and rules, 11 million words).
type Limits struct {
	// LineLength is the longest line, in bytes. iptables-restore reads
	// lines of up to 10 KiB; kube-proxy's are a few hundred bytes.
	LineLength int
	// Size is the largest dump, in bytes.
	Size int64
	// Entries is the most chains and rules, together (a rule costs a few
	// hundred bytes of memory however short its line).
	Entries int
	// Words is the most words in rules (each costs a string).
	Words int
}

// DefaultLimits are the limits of Parse.
func DefaultLimits() Limits {
	return Limits{LineLength: 64 << 10, Size: 256 << 20, Entries: 2_500_000, Words: 25_000_000}
}

// Parse reads iptables-save output within DefaultLimits. It fails on text
// that is not iptables-save output: a rule or chain outside a table, a
// table twice, a rule for a chain the table did not declare, an option
// without its value, or nothing at all.
func Parse(r io.Reader) (*Dump, error) { return ParseWithin(r, DefaultLimits()) }

// ParseWithin is Parse with other limits.
func ParseWithin(r io.Reader, lim Limits) (*Dump, error) {
	in := &countingReader{r: io.LimitReader(r, lim.Size+1)}
	p := &parser{lim: lim, in: in, d: &Dump{Tables: map[string]*Table{}}, began: map[string]int{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, min(64<<10, lim.LineLength+1)), lim.LineLength+1)
	for sc.Scan() {
		p.line++
		if err := p.parseLine(strings.TrimSpace(sc.Text())); err != nil {
			return nil, p.sizeError(err)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, p.sizeError(fmt.Errorf("line %d: longer than %s (iptables-restore takes lines of up to 10 KiB): not iptables-save output?", p.line+1, bytesText(int64(lim.LineLength))))
	} else if err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	if err := p.sizeError(nil); err != nil {
		return nil, err
	}
	return p.finish()
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

// parser is the state of one Parse.
type parser struct {
	lim   Limits
	in    *countingReader
	d     *Dump
	cur   *Table
	line  int            // number of the line being read
	began map[string]int // line where each table began
	// entries counts chains and rules, words the words of rules.
	entries, words                    int
	sawV6Header, sawV4Addr, sawV6Addr bool
}

// sizeError is the error of a dump larger than the limit, which explains
// any other error (a line cut short), or err.
func (p *parser) sizeError(err error) error {
	if p.in.n > p.lim.Size {
		return fmt.Errorf("larger than %s: not one node's iptables-save output?", bytesText(p.lim.Size))
	}
	return err
}

// bytesText says n in MiB or KiB where it is a whole number of them.
func bytesText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// parseLine reads one line, trimmed.
func (p *parser) parseLine(line string) error {
	switch {
	case line == "":
		return nil
	case strings.HasPrefix(line, "#"):
		if strings.Contains(line, "ip6tables") {
			p.sawV6Header = true
		}
		return nil
	case strings.HasPrefix(line, "*"):
		return p.beginTable(line[1:])
	case line == "COMMIT":
		if p.cur == nil {
			return fmt.Errorf("line %d: COMMIT outside a table", p.line)
		}
		p.cur = nil
		return nil
	}
	if p.cur == nil {
		return fmt.Errorf("line %d: %q outside a table (not iptables-save output?)", p.line, trim(line))
	}
	if p.entries++; p.entries > p.lim.Entries {
		return fmt.Errorf("line %d: more than %d chains and rules: not one node's iptables-save output?", p.line, p.lim.Entries)
	}
	if strings.HasPrefix(line, ":") {
		return p.declareChain(line)
	}
	return p.addRule(line)
}

// beginTable starts the table of a "*name" line. iptables-save writes each
// table once; iptables-restore would let a second block replace the first,
// which here would hide half of what was given (two dumps in one file).
func (p *parser) beginTable(name string) error {
	if p.cur != nil {
		return fmt.Errorf("line %d: table %s begins before %s was committed", p.line, name, p.cur.Name)
	}
	if first, ok := p.began[name]; ok {
		return fmt.Errorf("line %d: table %s again (it began at line %d): iptables-save writes each table once; two dumps in one file?", p.line, name, first)
	}
	p.began[name] = p.line
	p.cur = &Table{Name: name, Policies: map[string]string{}, Rules: map[string][]*Rule{}}
	p.d.Tables[name] = p.cur
	return nil
}

// declareChain reads a ":CHAIN POLICY [counters]" line.
func (p *parser) declareChain(line string) error {
	f := strings.Fields(line[1:])
	if len(f) < 2 {
		return fmt.Errorf("line %d: bad chain line %q", p.line, trim(line))
	}
	if _, ok := p.cur.Policies[f[0]]; !ok {
		p.cur.Chains = append(p.cur.Chains, f[0])
	}
	p.cur.Policies[f[0]] = f[1]
	return nil
}

// addRule reads a "[counters] -A CHAIN ..." line.
func (p *parser) addRule(line string) error {
	if strings.HasPrefix(line, "[") { // -c counters: [packets:bytes] -A ...
		i := strings.IndexByte(line, ']')
		if i < 0 {
			return fmt.Errorf("line %d: unterminated counters in %q", p.line, trim(line))
		}
		line = strings.TrimSpace(line[i+1:])
	}
	words, err := split(line)
	if err != nil {
		return fmt.Errorf("line %d: %w", p.line, err)
	}
	if p.words += len(words); p.words > p.lim.Words {
		return fmt.Errorf("line %d: more than %d words in rules: not one node's iptables-save output?", p.line, p.lim.Words)
	}
	if len(words) < 2 || (words[0] != "-A" && words[0] != "--append") {
		return fmt.Errorf("line %d: want -A CHAIN ..., got %q", p.line, trim(line))
	}
	rule, err := parseRule(words[1], words[2:])
	if err != nil {
		return fmt.Errorf("line %d: %w", p.line, err)
	}
	if !p.cur.Has(rule.Chain) {
		return fmt.Errorf("line %d: rule for chain %s, which table %s does not declare", p.line, rule.Chain, p.cur.Name)
	}
	rule.Line = line
	for _, m := range []Match{rule.Src, rule.Dst} {
		if m.Valid() {
			p.sawV4Addr = p.sawV4Addr || m.Prefix.Addr().Is4()
			p.sawV6Addr = p.sawV6Addr || m.Prefix.Addr().Is6()
		}
	}
	p.cur.Rules[rule.Chain] = append(p.cur.Rules[rule.Chain], rule)
	return nil
}

// finish checks the whole dump and tells its family.
func (p *parser) finish() (*Dump, error) {
	if p.cur != nil {
		return nil, fmt.Errorf("table %s is not committed (truncated output?)", p.cur.Name)
	}
	if len(p.d.Tables) == 0 {
		return nil, fmt.Errorf("no tables: not iptables-save output")
	}
	switch {
	case p.sawV4Addr && p.sawV6Addr:
		return nil, fmt.Errorf("both IPv4 and IPv6 addresses: give iptables-save and ip6tables-save output separately")
	case p.sawV6Addr:
		p.d.IPv6 = true
	case !p.sawV4Addr:
		p.d.IPv6 = p.sawV6Header
	}
	return p.d, nil
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
