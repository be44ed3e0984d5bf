package migrate

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// NFTRuleset is what `nft list ruleset` printed of kube-proxy's nftables
// mode: its kube-proxy tables (ip and ip6), each a set of named sets, maps
// and chains. Other tables are skipped.
type NFTRuleset struct {
	Tables []*nftTable
}

// nftTable is one kube-proxy table as nft prints it.
type nftTable struct {
	ipv6 bool
	// elements of each set and map, by name; timeouts of the sets that
	// have one (session affinity), in seconds.
	elements map[string][]nftElement
	timeouts map[string]int
	// chains are each chain's rules as nft prints them.
	chains map[string][]string
}

// nftElement is one set or map element: its key's parts (" . "), its
// comment and, in a map, its value.
type nftElement struct {
	key     []string
	comment string
	value   string
}

// kubeProxyTable is the table upstream's nftables mode programs.
const kubeProxyTable = "kube-proxy"

// maxNFTLine bounds one line of the listing, as iptsave bounds a rule.
const maxNFTLine = 1 << 20

var (
	tableHeader = regexp.MustCompile(`^table (ip|ip6|inet|arp|bridge|netdev) (\S+) \{$`)
	blockHeader = regexp.MustCompile(`^(chain|set|map|counter|flowtable) (\S+) \{$`)
	commentPart = regexp.MustCompile(`\s*comment "((?:[^"\\]|\\.)*)"`)
	timeoutLine = regexp.MustCompile(`^timeout (\S+)$`)
)

// ParseNFTRuleset reads `nft list ruleset` output (or `nft list table ip
// kube-proxy`), keeping kube-proxy's tables.
func ParseNFTRuleset(r io.Reader) (*NFTRuleset, error) {
	p := &nftParser{out: &NFTRuleset{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxNFTLine)
	for sc.Scan() {
		p.line++
		if err := p.take(strings.TrimSpace(sc.Text())); err != nil {
			return nil, fmt.Errorf("line %d: %w", p.line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", p.line+1, err)
	}
	if p.depth != 0 || p.elements != "" {
		return nil, fmt.Errorf("the listing ends inside a block (cut short?)")
	}
	if len(p.out.Tables) == 0 {
		return nil, fmt.Errorf("no table %q of family ip or ip6: not a listing of kube-proxy's nftables mode", kubeProxyTable)
	}
	return p.out, nil
}

// nftParser walks the listing line by line: table, block (chain, set,
// map), and the elements of a set or map, which may span lines.
type nftParser struct {
	out   *NFTRuleset
	line  int
	depth int       // 0 outside tables, 1 in a table, 2 in a block
	table *nftTable // nil inside a table that is not kube-proxy's
	kind  string    // the block's kind and name
	name  string
	// elements gathers an "elements = { ... }" until its closing brace.
	elements string
}

func (p *nftParser) take(l string) error {
	if p.elements != "" {
		return p.moreElements(l)
	}
	switch {
	case l == "":
		return nil
	case l == "}":
		if p.depth == 0 {
			return fmt.Errorf("a closing brace outside any table")
		}
		p.depth--
		return nil
	case p.depth == 0:
		return p.tableStart(l)
	case p.depth == 1:
		return p.blockStart(l)
	}
	return p.blockLine(l)
}

func (p *nftParser) tableStart(l string) error {
	m := tableHeader.FindStringSubmatch(l)
	if m == nil {
		return fmt.Errorf("want a table, got %q", l)
	}
	p.depth, p.table = 1, nil
	if m[2] == kubeProxyTable && (m[1] == "ip" || m[1] == "ip6") {
		p.table = &nftTable{ipv6: m[1] == "ip6", elements: map[string][]nftElement{}, timeouts: map[string]int{}, chains: map[string][]string{}}
		p.out.Tables = append(p.out.Tables, p.table)
	}
	return nil
}

func (p *nftParser) blockStart(l string) error {
	if strings.HasPrefix(l, "comment ") || strings.HasPrefix(l, "flags ") {
		return nil // the table's own
	}
	m := blockHeader.FindStringSubmatch(l)
	if m == nil {
		return fmt.Errorf("want a chain, set or map, got %q", l)
	}
	p.depth, p.kind, p.name = 2, m[1], strings.Trim(m[2], `"`)
	if p.table != nil && p.kind == "chain" {
		p.table.chains[p.name] = []string{}
	}
	return nil
}

// blockLine is one line inside a chain (a rule, or the base chain's
// header), set or map (type, flags, timeout, comment, elements).
func (p *nftParser) blockLine(l string) error {
	if p.table == nil {
		if strings.HasPrefix(l, "elements = {") && !strings.HasSuffix(l, "}") {
			p.elements = l // skipped, but followed to its end
		}
		return nil
	}
	switch {
	case strings.HasPrefix(l, "elements = {"):
		p.elements = l
		if strings.HasSuffix(l, "}") {
			return p.moreElements("")
		}
		return nil
	case p.kind == "chain":
		if strings.HasPrefix(l, "type ") && strings.Contains(l, " hook ") || strings.HasPrefix(l, "comment \"") || strings.HasPrefix(l, "policy ") {
			return nil
		}
		p.table.chains[p.name] = append(p.table.chains[p.name], l)
	default:
		if m := timeoutLine.FindStringSubmatch(l); m != nil {
			s, err := nftSeconds(m[1])
			if err != nil {
				return fmt.Errorf("%s %s: %w", p.kind, p.name, err)
			}
			p.table.timeouts[p.name] = s
		}
	}
	return nil
}

// moreElements adds a line to the elements being gathered; at the closing
// brace they are split and kept.
func (p *nftParser) moreElements(l string) error {
	if l != "" {
		p.elements += " " + l
	}
	if !strings.HasSuffix(p.elements, "}") {
		return nil
	}
	body := strings.TrimSuffix(strings.TrimPrefix(p.elements, "elements = {"), "}")
	p.elements = ""
	if p.table == nil {
		return nil
	}
	for _, text := range splitElements(body) {
		el, err := parseElement(text, p.kind == "map")
		if err != nil {
			return fmt.Errorf("%s %s: %w", p.kind, p.name, err)
		}
		p.table.elements[p.name] = append(p.table.elements[p.name], el)
	}
	return nil
}

// splitElements splits a set's or map's elements at the commas outside
// quotes and braces.
func splitElements(body string) []string {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{':
			depth++
		case c == '}':
			depth--
		case c == ',' && depth == 0:
			out = append(out, strings.TrimSpace(body[start:i]))
			start = i + 1
		}
	}
	if last := strings.TrimSpace(body[start:]); last != "" {
		out = append(out, last)
	}
	return out
}

// parseElement reads "a . b . c [timeout ...] [comment "..."] [: value]".
func parseElement(text string, isMap bool) (nftElement, error) {
	var el nftElement
	if m := commentPart.FindStringSubmatch(text); m != nil {
		el.comment = strings.ReplaceAll(m[1], `\"`, `"`)
		text = commentPart.ReplaceAllString(text, "")
	}
	if isMap {
		k, v, ok := strings.Cut(text, " : ")
		if !ok {
			return el, fmt.Errorf("map element %q has no value", text)
		}
		text, el.value = k, strings.TrimSpace(v)
	}
	if i := strings.Index(text, " timeout "); i >= 0 {
		text = text[:i]
	}
	for _, part := range strings.Split(text, " . ") {
		el.key = append(el.key, strings.TrimSpace(part))
	}
	return el, nil
}

// nftSeconds reads a duration as nft prints it ("3h", "2h46m40s", "10800s",
// "1d"), in whole seconds.
func nftSeconds(s string) (int, error) {
	total, num := 0, 0
	seen := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' {
			num, seen = num*10+int(c-'0'), true
			continue
		}
		unit := map[byte]int{'d': 86400, 'h': 3600, 'm': 60, 's': 1}[c]
		if c == 'm' && i+1 < len(s) && s[i+1] == 's' { // milliseconds
			unit, i = 0, i+1
		}
		if !seen || (unit == 0 && c != 'm') {
			return 0, fmt.Errorf("duration %q: want nft's form, e.g. 3h or 10800s", s)
		}
		total, num, seen = total+num*unit, 0, false
	}
	if seen {
		return 0, fmt.Errorf("duration %q: a number without a unit", s)
	}
	return total, nil
}
