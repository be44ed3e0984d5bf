package iptsave

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// TestParseRuleOptions reads each option the parser knows, and some it
// does not, and compares the whole rule it makes.
func TestParseRuleOptions(t *testing.T) {
	recent := func(r Recent) *Recent { return &r }
	mark := func(m Mark) *Mark { return &m }
	for _, tc := range []struct {
		words string
		want  Rule // Chain is always "C"
	}{
		{"-s 10.0.0.1", Rule{Src: Match{Prefix: netip.MustParsePrefix("10.0.0.1/32")}}},
		{"! --source 10.0.0.7/8", Rule{Src: Match{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Negate: true}}},
		{"-d fd00::1/64", Rule{Dst: Match{Prefix: netip.MustParsePrefix("fd00::/64")}}},
		{"! --destination 10.1.0.0/16", Rule{Dst: Match{Prefix: netip.MustParsePrefix("10.1.0.0/16"), Negate: true}}},
		{"-p TCP", Rule{Proto: "tcp"}},
		{"! --protocol udp", Rule{Proto: "!udp"}},
		{"--dport 8080", Rule{Dport: 8080}},
		{"--destination-port 30000:32767", Rule{Other: []string{"--destination-port", "30000:32767"}}},
		{"! --dport 53", Rule{Other: []string{"!--dport", "53"}}},
		{"-i eth0", Rule{InIface: "eth0"}},
		{"! --in-interface lo", Rule{InIface: "!lo"}},
		{"-m comment -m tcp -m udp -m sctp -m addrtype -m statistic -m recent -m conntrack -m state -m mark", Rule{}},
		{"--match multiport ! -m foo", Rule{Other: []string{"--match", "multiport", "-m", "foo"}}},
		{`--comment "a b"`, Rule{Comment: "a b"}},
		{"--src-type LOCAL ! --dst-type LOCAL", Rule{SrcType: "LOCAL", DstType: "!LOCAL"}},
		{"--mode random --probability 0.5", Rule{Probability: 0.5}},
		{"--mode nth", Rule{Other: []string{"--mode", "nth"}}},
		{"--name X --seconds 10", Rule{Recent: recent(Recent{Name: "X", Seconds: 10})}},
		{"--set --rsource", Rule{Recent: recent(Recent{Set: true})}},
		{"--rcheck --reap", Rule{Recent: recent(Recent{Check: true, Reap: true})}},
		{"--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --mask 255.255.255.255", Rule{}},
		{"--mask 255.255.255.0", Rule{Other: []string{"--mask", "255.255.255.0"}}},
		{"--ctstate INVALID", Rule{CtState: "INVALID"}},
		{"! --state NEW", Rule{CtState: "!NEW"}},
		{"--mark 0x4000/0x4000", Rule{Mark: mark(Mark{Value: 0x4000, Mask: 0x4000})}},
		{"! --mark 7", Rule{Mark: mark(Mark{Value: 7, Mask: 0xffffffff, Negate: true})}},
		{"-j KUBE-SVC-X", Rule{Target: "KUBE-SVC-X"}},
		{"--jump ACCEPT", Rule{Target: "ACCEPT"}},
		{"-g KUBE-SEP-Y", Rule{Target: "KUBE-SEP-Y", Goto: true}},
		{"--goto KUBE-SEP-Y", Rule{Target: "KUBE-SEP-Y", Goto: true}},
		{"--to-destination 10.0.0.1:80", Rule{ToDestination: "10.0.0.1:80"}},
		{"--set-xmark 0x4000/0xffffffff", Rule{SetXMark: mark(Mark{Value: 0x4000, Mask: 0xffffffff})}},
		{"--or-mark 0x4000", Rule{SetXMark: mark(Mark{Value: 0x4000, Mask: 0x4000})}},
		{"--xor-mark 0x4000", Rule{SetXMark: mark(Mark{Value: 0x4000})}},
		{"--random-fully", Rule{RandomFully: true}},
		{"--reject-with icmp-port-unreachable", Rule{RejectWith: "icmp-port-unreachable"}},
		{"--foo 1 2 ! --bar -j X", Rule{Other: []string{"--foo", "1", "2", "!--bar"}, Target: "X"}},
	} {
		words, err := split(tc.words)
		if err != nil {
			t.Fatalf("%s: %v", tc.words, err)
		}
		got, err := parseRule("C", words)
		if err != nil {
			t.Errorf("%s: %v", tc.words, err)
			continue
		}
		tc.want.Chain = "C"
		if !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.words, *got, tc.want)
		}
	}
}

// TestParseRuleOptionErrors checks that an option the parser reads fails
// with its name when its value is missing or wrong.
func TestParseRuleOptionErrors(t *testing.T) {
	for _, tc := range []struct{ words, want string }{
		{"-s", "-s without a value"},
		{"-d 10.0.0.300", `-d "10.0.0.300"`},
		{"-p", "-p without a value"},
		{"--dport", "--dport without a value"},
		{"-i", "-i without a value"},
		{"-m", "-m without a value"},
		{"--comment", "--comment without a value"},
		{"--src-type", "--src-type without a value"},
		{"--mode", "--mode without a value"},
		{"--probability 2", `--probability "2": want a number within 0-1`},
		{"--probability x", `--probability "x"`},
		{"--seconds x", `--seconds "x"`},
		{"--name", "--name without a value"},
		{"--mask", "--mask without a value"},
		{"--ctstate", "--ctstate without a value"},
		{"--mark 0x1/x", `--mark: "0x1/x"`},
		{"-j", "-j without a value"},
		{"--to-destination", "--to-destination without a value"},
		{"--or-mark x", `--or-mark: "x"`},
		{"--reject-with", "--reject-with without a value"},
	} {
		words, err := split(tc.words)
		if err != nil {
			t.Fatalf("%s: %v", tc.words, err)
		}
		if _, err := parseRule("C", words); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.words, err, tc.want)
		}
	}
}
