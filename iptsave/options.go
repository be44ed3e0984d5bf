package iptsave

import (
	"fmt"
	"strconv"
	"strings"
)

// option is one word of a rule the parser interprets and its value.
type option struct {
	name, value string
	// negate is true after "!": options that cannot be negated ignore it.
	negate bool
}

// bang is "!" for a negated option, as the rule's text fields keep it.
func (o option) bang() string {
	if o.negate {
		return "!"
	}
	return ""
}

// optionReader reads one kind of statement into a rule.
type optionReader struct {
	// takesValue is true for options followed by one value.
	takesValue bool
	read       func(r *Rule, o option) error
}

// valued is the reader of an option followed by one value.
func valued(read func(*Rule, option) error) optionReader { return optionReader{true, read} }

// flag is the reader of an option without a value.
func flag(read func(*Rule, option) error) optionReader { return optionReader{false, read} }

// optionReaders are the options kube-proxy writes, by statement kind:
// addresses and ports, match modules, the recent match, and targets.
var optionReaders = map[string]optionReader{
	"-s": valued(readAddress), "--source": valued(readAddress),
	"-d": valued(readAddress), "--destination": valued(readAddress),
	"-p": valued(readProtocol), "--protocol": valued(readProtocol),
	"--dport": valued(readPort), "--destination-port": valued(readPort),
	"-i": valued(readInterface), "--in-interface": valued(readInterface),

	"-m": valued(readModule), "--match": valued(readModule),
	"--comment":  valued(readMatch),
	"--src-type": valued(readMatch), "--dst-type": valued(readMatch),
	"--mode": valued(readMatch), "--probability": valued(readMatch),
	"--ctstate": valued(readMatch), "--state": valued(readMatch),
	"--mark": valued(readMatch),

	"--name": valued(readRecent), "--seconds": valued(readRecent), "--mask": valued(readRecent),
	"--set": flag(readRecent), "--rcheck": flag(readRecent), "--reap": flag(readRecent),
	"--rsource": flag(readRecent),

	"-j": valued(readTarget), "--jump": valued(readTarget),
	"-g": valued(readTarget), "--goto": valued(readTarget),
	"--to-destination": valued(readTarget),
	"--set-xmark":      valued(readTarget), "--or-mark": valued(readTarget), "--xor-mark": valued(readTarget),
	"--random-fully": flag(readTarget),
	"--reject-with":  valued(readTarget),
}

// parseRule reads the words after "-A CHAIN".
func parseRule(chain string, w []string) (*Rule, error) {
	r := &Rule{Chain: chain}
	negate := false
	for i := 0; i < len(w); i++ {
		o := option{name: w[i], negate: negate}
		if o.name == "!" {
			negate = true
			continue
		}
		negate = false
		reader, known := optionReaders[o.name]
		if !known {
			// An option we do not know: keep it and its values as written.
			r.Other = append(r.Other, o.bang()+o.name)
			for i+1 < len(w) && !strings.HasPrefix(w[i+1], "-") && w[i+1] != "!" {
				i++
				r.Other = append(r.Other, w[i])
			}
			continue
		}
		if reader.takesValue {
			if i+1 >= len(w) {
				return nil, fmt.Errorf("%s without a value", o.name)
			}
			i++
			o.value = w[i]
		}
		if err := reader.read(r, o); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func readAddress(r *Rule, o option) error {
	p, err := parsePrefix(o.value)
	if err != nil {
		return fmt.Errorf("%s %q: %w", o.name, o.value, err)
	}
	if o.name == "-s" || o.name == "--source" {
		r.Src = Match{Prefix: p, Negate: o.negate}
	} else {
		r.Dst = Match{Prefix: p, Negate: o.negate}
	}
	return nil
}

func readProtocol(r *Rule, o option) error {
	r.Proto = o.bang() + strings.ToLower(o.value)
	return nil
}

func readPort(r *Rule, o option) error {
	port, err := strconv.ParseUint(o.value, 10, 16)
	if err != nil || o.negate {
		r.Other = append(r.Other, o.bang()+o.name, o.value) // a range or a negation: not kube-proxy's
		return nil
	}
	r.Dport = int(port)
	return nil
}

func readInterface(r *Rule, o option) error {
	r.InIface = o.bang() + o.value
	return nil
}

// readModule reads "-m MODULE": the modules whose options the parser
// reads leave no trace; others are kept in Other.
func readModule(r *Rule, o option) error {
	switch o.value {
	case "comment", "tcp", "udp", "sctp", "addrtype", "statistic", "recent", "conntrack", "state", "mark":
	default:
		r.Other = append(r.Other, o.name, o.value)
	}
	return nil
}

// readMatch reads the options of the comment, addrtype, statistic,
// conntrack/state and mark matches.
func readMatch(r *Rule, o option) error {
	switch o.name {
	case "--comment":
		r.Comment = o.value
	case "--src-type":
		r.SrcType = o.bang() + o.value
	case "--dst-type":
		r.DstType = o.bang() + o.value
	case "--mode":
		if o.value != "random" {
			r.Other = append(r.Other, o.name, o.value)
		}
	case "--probability":
		p, err := strconv.ParseFloat(o.value, 64)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("--probability %q: want a number within 0-1", o.value)
		}
		r.Probability = p
	case "--ctstate", "--state":
		r.CtState = o.bang() + o.value
	case "--mark":
		m, err := parseMark(o.value)
		if err != nil {
			return fmt.Errorf("--mark: %w", err)
		}
		m.Negate = o.negate
		r.Mark = &m
	}
	return nil
}

// readRecent reads the options of the recent match (session affinity).
func readRecent(r *Rule, o option) error {
	if o.name == "--mask" {
		if o.value != "255.255.255.255" && o.value != "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" {
			r.Other = append(r.Other, o.name, o.value)
		}
		return nil
	}
	if o.name == "--rsource" {
		return nil
	}
	if r.Recent == nil {
		r.Recent = &Recent{}
	}
	switch o.name {
	case "--name":
		r.Recent.Name = o.value
	case "--seconds":
		s, err := strconv.Atoi(o.value)
		if err != nil {
			return fmt.Errorf("--seconds %q: %w", o.value, err)
		}
		r.Recent.Seconds = s
	case "--set":
		r.Recent.Set = true
	case "--rcheck":
		r.Recent.Check = true
	case "--reap":
		r.Recent.Reap = true
	}
	return nil
}

// readTarget reads -j/-g and the options of the DNAT, MARK, MASQUERADE
// and REJECT targets.
func readTarget(r *Rule, o option) error {
	switch o.name {
	case "-j", "--jump", "-g", "--goto":
		r.Target = o.value
		r.Goto = o.name == "-g" || o.name == "--goto"
	case "--to-destination":
		r.ToDestination = o.value
	case "--set-xmark", "--or-mark", "--xor-mark":
		m, err := parseMark(o.value)
		if err != nil {
			return fmt.Errorf("%s: %w", o.name, err)
		}
		switch o.name {
		case "--or-mark": // iptables-save prints it as --set-xmark V/V
			m.Mask = m.Value
		case "--xor-mark": // ... and this as --set-xmark V/0
			m.Mask = 0
		}
		r.SetXMark = &m
	case "--random-fully":
		r.RandomFully = true
	case "--reject-with":
		r.RejectWith = o.value
	}
	return nil
}
