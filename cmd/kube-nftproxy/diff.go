package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/migrate"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Exit codes of `diff`, as diff(1): equal, different, trouble.
const (
	exitEqual     = 0
	exitDifferent = 1
	exitBadInput  = 2
)

func newDiffCommand() *cobra.Command {
	o := &options{}
	var dumps []string
	var ruleset string
	cmd := &cobra.Command{
		Use:   "diff (--iptables-save FILE | --nft-ruleset FILE) [--state PATH]",
		Short: "compare kube-proxy's iptables rules (iptables-save output) with ours, Service port by Service port",
		Long: `diff reads iptables-save (and/or ip6tables-save) output of a node where kube-proxy
ran in iptables mode, and compares it with kube-nftproxy's tables in this network
namespace (or, with --state, with what kube-nftproxy would program for those
objects), Service port by Service port: chain names, destinations, endpoints and
their probabilities, masquerading, source ranges, session affinity, NodePorts,
external and load balancer IPs; then the node-wide rules (the hooks' jumps,
KUBE-POSTROUTING, KUBE-FORWARD, KUBE-MARK-MASQ, the NodePort addresses, localhost
NodePorts). Differences of form (maps, numgen, comments) are not differences;
deliberate ones are named as known differences; a rule it cannot read is a
difference. It prints one line per Service port, the node-wide lines, what is
probably missing (--cluster-cidr) and a summary, and exits 0 when everything is
equal, 1 when something differs, 2 on bad input.

With --nft-ruleset it reads instead the output of nft list ruleset on a node where
kube-proxy ran in nftables mode (its ip and ip6 kube-proxy tables), and compares
each Service port's destinations, endpoints and their chances, session affinity,
source ranges and the routing of external traffic; node-wide rules are not
compared.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.completeRuleCommand(cmd.Flags(), "state", "iptables-save", "nft-ruleset"); err != nil {
				return &exitError{code: exitBadInput, err: err}
			}
			if ruleset != "" {
				code, err := runDiffNFT(cmd.OutOrStdout(), cmd.InOrStdin(), cmd.ErrOrStderr(), o, ruleset, len(dumps) > 0)
				if code == exitEqual {
					return nil
				}
				return &exitError{code: code, err: err}
			}
			code, err := runDiff(cmd.OutOrStdout(), cmd.InOrStdin(), cmd.ErrOrStderr(), o, dumps)
			if code == exitEqual {
				return nil
			}
			return &exitError{code: code, err: err}
		},
	}
	cmd.Flags().StringArrayVar(&dumps, "iptables-save", nil, "iptables-save or ip6tables-save output to compare (\"-\": standard input); give it twice for both families")
	cmd.Flags().StringVar(&ruleset, "nft-ruleset", "", "instead: nft list ruleset output of a node where kube-proxy ran in nftables mode (\"-\": standard input)")
	o.addRuleCommandFlags(cmd.Flags(), "iptables or nftables; with --state")
	return cmd
}

// errDifferent is what diff returns when something differs (exit code 1).
var errDifferent = errors.New("the rules differ")

// runDiff compares the dumps with our live tables or the render of --state,
// writes the report and returns the exit code, with an error saying why
// when it is not 0.
func runDiff(out io.Writer, stdin io.Reader, stderr io.Writer, o *options, paths []string) (int, error) {
	if len(paths) == 0 {
		return exitBadInput, errors.New("diff needs --iptables-save FILE")
	}
	var dumps []*iptsave.Dump
	for _, p := range paths {
		d, err := readDump(p, stdin)
		if err != nil {
			return exitBadInput, err
		}
		dumps = append(dumps, d)
	}
	ours, err := oursToCompare(o, stderr)
	if err != nil {
		return exitBadInput, err
	}
	return report(out, o, ours, func(rs *nftlib.Ruleset) (*migrate.Report, error) {
		return migrate.CompareWith(dumps, rs, ours.want)
	})
}

// report compares ours with compare, writes the report (with --state,
// after the mode it rendered and, when everything that differs would be
// equal in the other mode, a hint saying so) and returns the exit code.
func report(out io.Writer, o *options, ours compared, compare func(*nftlib.Ruleset) (*migrate.Report, error)) (int, error) {
	rep, err := compare(ours.rs)
	if err != nil {
		return exitBadInput, err
	}
	if ours.st != nil {
		fmt.Fprintf(out, "mode: %s\n", o.assumedMode())
		if !rep.Equal() {
			rep.Likely = append(rep.Likely, otherModeHint(o, ours, func(rs *nftlib.Ruleset) bool {
				alt, err := compare(rs)
				return err == nil && alt.Equal()
			})...)
		}
	}
	if err := rep.Write(out); err != nil {
		return exitBadInput, err
	}
	if !rep.Equal() {
		return exitDifferent, errDifferent
	}
	return exitEqual, nil
}

// otherModeHint is a hint when the other of iptables and nftables mode,
// with the same flags, renders rules that equalIn finds equal.
func otherModeHint(o *options, ours compared, equalIn func(*nftlib.Ruleset) bool) []string {
	other := modeNFTables
	if o.modeName() == modeNFTables {
		other = modeIPTables
	}
	alt := o.inMode(other)
	rs, err := renderState(alt, ours.st)
	if err != nil || !equalIn(rs) {
		return nil
	}
	return []string{fmt.Sprintf("--proxy-mode %s: in that mode (NodePorts on %s) every difference goes away; the dump's kube-proxy ran with that mode's settings: diff (and run ours) with --proxy-mode %s, or give --config with kube-proxy's configuration file",
		other, alt.nodePortsServed(), other)}
}

// runDiffNFT compares an nft listing of kube-proxy's nftables mode with
// our live tables or the render of --state, as runDiff does.
func runDiffNFT(out io.Writer, stdin io.Reader, stderr io.Writer, o *options, path string, withDumps bool) (int, error) {
	if withDumps {
		return exitBadInput, errors.New("diff takes --iptables-save or --nft-ruleset, not both")
	}
	r, closeFile, err := openInput(path, stdin)
	if err != nil {
		return exitBadInput, fmt.Errorf("--nft-ruleset: %w", err)
	}
	theirs, err := migrate.ParseNFTRuleset(r)
	closeFile()
	if err != nil {
		return exitBadInput, fmt.Errorf("--nft-ruleset %s: %w", path, err)
	}
	ours, err := oursToCompare(o, stderr)
	if err != nil {
		return exitBadInput, err
	}
	return report(out, o, ours, func(rs *nftlib.Ruleset) (*migrate.Report, error) {
		return migrate.CompareNFT(theirs, rs)
	})
}

// openInput opens path, or for "-" standard input.
func openInput(path string, stdin io.Reader) (io.Reader, func(), error) {
	if path == "-" {
		return stdin, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { f.Close() }, nil
}

func readDump(path string, stdin io.Reader) (*iptsave.Dump, error) {
	r, closeFile, err := openInput(path, stdin)
	if err != nil {
		return nil, fmt.Errorf("--iptables-save: %w", err)
	}
	defer closeFile()
	d, err := iptsave.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("--iptables-save %s: %w", path, err)
	}
	return d, nil
}

// compared is our side of a diff: with --state, its render, the State and
// what its objects say of the Services; else the live tables alone.
type compared struct {
	rs   *nftlib.Ruleset
	st   *model.State
	want migrate.Expect
}

func oursToCompare(o *options, stderr io.Writer) (compared, error) {
	if o.statePath == "" {
		rs, err := oursFor(o, stderr)
		return compared{rs: rs}, err
	}
	st, err := loadState(o, klogSlog())
	if err != nil {
		return compared{}, err
	}
	rs, err := renderState(o, st)
	return compared{rs: rs, st: st, want: migrate.ExpectFromState(st)}, err
}

func renderState(o *options, st *model.State) (*nftlib.Ruleset, error) {
	if m := o.modeName(); m != modeNFTables && m != modeIPTables {
		return nil, fmt.Errorf("--proxy-mode %q: diff renders nftables or iptables", o.proxyMode)
	}
	cfg, err := o.nftConfig()
	if err != nil {
		return nil, err
	}
	return nft.Build(st, cfg), nil
}

// oursFor is our ruleset: the render of --state, or the live tables.
func oursFor(o *options, stderr io.Writer) (*nftlib.Ruleset, error) {
	if o.statePath != "" {
		st, err := loadState(o, klogSlog())
		if err != nil {
			return nil, err
		}
		return renderState(o, st)
	}
	k, err := nftlib.OpenKernel("")
	if err != nil {
		return nil, needPrivileges("opening nftables", err)
	}
	defer k.Close()
	rs, err := nft.ReadRuleset(k, nft.DefaultTableName)
	if err != nil {
		return nil, needPrivileges("reading our tables", err)
	}
	if len(rs.Tables) == 0 {
		return nil, fmt.Errorf("no %s tables in this network namespace: is kube-nftproxy running here? (or give --state)", nft.DefaultTableName)
	}
	return rs, nil
}
