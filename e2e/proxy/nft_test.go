package proxy

import (
	"bufio"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
)

// Chain names, computed here independently of package nft, as iptables
// mode names them: a prefix and the first 16 characters of
// base32(sha256(servicePortName + protocol [+ endpoint])).

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// svcChain is KUBE-SVC-<h> for service port spn ("ns/name:port") and proto
// ("tcp", "udp").
func svcChain(spn, proto string) string { return "KUBE-SVC-" + hash16(spn+proto) }

// extChain is KUBE-EXT-<h>, with the same hash as svcChain.
func extChain(spn, proto string) string { return "KUBE-EXT-" + hash16(spn+proto) }

// sepChain is KUBE-SEP-<h> for one endpoint ("10.0.0.1:80", "[fd00::1]:80").
func sepChain(spn, proto string, ep netip.AddrPort) string {
	return "KUBE-SEP-" + hash16(spn+proto+ep.String())
}

// The examples from docs/architecture.md, which are kube-proxy's.
func TestChainNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spn, proto, want string }{
		{"default/kubernetes:https", "tcp", "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{"kube-system/kube-dns:dns", "udp", "KUBE-SVC-TCOU7JCQXEZGVUNU"},
	} {
		if got := svcChain(tc.spn, tc.proto); got != tc.want {
			t.Errorf("svcChain(%q, %q) = %s, want %s", tc.spn, tc.proto, got, tc.want)
		}
	}
}

// ruleset is what `nft list ruleset` printed, by table ("ip kube-nftproxy")
// and block ("chain KUBE-SERVICES", "map service-ips"): the block's lines
// without their indentation, continuation lines of element lists included.
type ruleset map[string]map[string][]string

var (
	// An owned table (the instance lock's) has "# progname NAME" after its brace.
	tableRE = regexp.MustCompile(`^table (\S+ \S+) \{(?: # .*)?$`)
	blockRE = regexp.MustCompile(`^\t((?:chain|map|set) \S+) \{$`)
)

// parseRuleset reads nft's listing, which puts tables at column 0, their
// chains, maps and sets one tab in and closes those with "\t}".
func parseRuleset(text string) (ruleset, error) {
	rs := ruleset{}
	var table, block string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case table == "":
			mt := tableRE.FindStringSubmatch(line)
			if mt == nil {
				return nil, fmt.Errorf("line %d: want a table, got %q", n, line)
			}
			table = mt[1]
			rs[table] = map[string][]string{}
		case line == "}":
			table, block = "", ""
		case block == "":
			if mb := blockRE.FindStringSubmatch(line); mb != nil {
				block = mb[1]
				rs[table][block] = []string{}
			} // else the table's comment or flags, or a blank line
		case line == "\t}":
			block = ""
		default:
			rs[table][block] = append(rs[table][block], strings.TrimSpace(line))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if table != "" {
		return nil, fmt.Errorf("table %s is not closed", table)
	}
	return rs, nil
}

// chain returns the body of a chain of family's kube-nftproxy tables: the
// main table or the delta table, where a service port lives for a while
// after it changed.
func (rs ruleset) chain(family, name string) ([]string, bool) {
	for _, table := range []string{family + " kube-nftproxy", family + " kube-nftproxy-delta"} {
		if body, ok := rs[table]["chain "+name]; ok {
			return body, true
		}
	}
	return nil, false
}

// mapText returns a map's lines, joined, from both kube-nftproxy tables of
// family.
func (rs ruleset) mapText(family, name string) string {
	var s []string
	for _, table := range []string{family + " kube-nftproxy", family + " kube-nftproxy-delta"} {
		s = append(s, rs[table]["map "+name]...)
	}
	return strings.Join(s, "\n")
}

func TestParseRuleset(t *testing.T) {
	t.Parallel()
	text := `table ip kube-nftproxy {
	comment "rules for kube-nftproxy"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.53 . udp . 53 comment "a" : goto KUBE-SVC-A,
			     10.96.0.10 . tcp . 80 comment "b" : goto KUBE-SVC-B }
	}

	chain KUBE-SVC-B {
		comment "default/web:http"
		goto KUBE-SEP-X
	}
}
table ip6 other {
	chain c {
	}
}
table ip kube-nftproxy-lock { # progname kube-nftproxy
	flags owner
	comment "kube-nftproxy instance lock, held by pid 7: one proxy per network namespace; deleted when it exits"
}
`
	rs, err := parseRuleset(text)
	if err != nil {
		t.Fatal(err)
	}
	if body, ok := rs.chain("ip", "KUBE-SVC-B"); !ok || strings.Join(body, "|") != `comment "default/web:http"|goto KUBE-SEP-X` {
		t.Errorf("chain KUBE-SVC-B = %q, %v", body, ok)
	}
	if m := rs.mapText("ip", "service-ips"); !strings.Contains(m, `comment "b" : goto KUBE-SVC-B`) {
		t.Errorf("map service-ips = %q", m)
	}
	if body, ok := rs["ip6 other"]["chain c"]; !ok || len(body) != 0 {
		t.Errorf("ip6 other chain c = %q, %v", body, ok)
	}
	if _, ok := rs["ip kube-nftproxy-lock"]; !ok {
		t.Errorf("the lock table (an owned table) was not read")
	}
	if _, err := parseRuleset("table ip t {\n"); err == nil {
		t.Error("an unclosed table parsed")
	}
}
