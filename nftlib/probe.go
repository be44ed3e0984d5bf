package nftlib

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// MinKernel is the oldest Linux release whose nf_tables has every feature
// the package writes: table and chain comments came last, in 5.10.
const MinKernel = "5.10"

// feature is one thing of nf_tables that the package writes, and what a
// kernel without it lacks.
type feature struct {
	name   string // what is written, e.g. "chain comments"
	kernel string // the kernel's name for it: attribute, expression, module
	since  string // the Linux release that brought it
	// intervals: interval sets of concatenations, probed only when asked
	// for (ProbeFeatures).
	intervals bool
	// write adds the objects that use the feature to the scratch table,
	// which the probe creates (with a comment) before and deletes after.
	write func(b *batch, f Family, table string)
	// kept, for a feature that an older kernel ignores without an error
	// (an attribute it does not know), checks the kernel's echo of the
	// objects written with NLM_F_ECHO.
	kept func(table string, echo []syscall.NetlinkMessage) bool
}

// probeComment is the scratch table's and chain's comment, which the kernel
// must echo back.
const probeComment = "nftlib feature probe"

// features lists what the package writes, in the order probed: the oldest
// and most basic first, so that the error names the first thing missing.
func features() []feature {
	return []feature{
		{name: "tables of this family", kernel: "CONFIG_NF_TABLES_IPV4, CONFIG_NF_TABLES_IPV6", since: "3.13"},
		{name: "base chains of type nat", kernel: "chain type nat, module nft_chain_nat", since: "3.13",
			write: probeBaseChains},
		{name: "verdict maps with concatenated keys: ip daddr . meta l4proto . th dport vmap",
			kernel: "NFT_SET_MAP with a concatenation, nft_set_hash", since: "4.1", write: probeVmap},
		{name: "packet marks and interface names: meta mark set, iifname", kernel: "expressions meta and bitwise", since: "3.13",
			write: probeTerms(MarkSet{Bit: 0x4000}, MarkZero{Bit: 0x4000}, IfName{Name: "probe", Prefix: true})},
		{name: "conntrack state: ct state new", kernel: "expression ct, module nft_ct", since: "3.13",
			write: probeTerms(CtState{Bits: 8})},
		{name: "fib: fib daddr type local", kernel: "expression fib, modules nft_fib_ipv4 and nft_fib_ipv6", since: "4.10",
			write: probeTerms(FibLocal{})},
		{name: "reject", kernel: "expression reject, modules nft_reject_ipv4 and nft_reject_ipv6", since: "3.14",
			write: probeReject},
		{name: "random numbers: numgen random", kernel: "expression numgen, module nft_numgen", since: "4.9",
			write: probeTerms(NumgenZero{Mod: 2})},
		{name: "DNAT to an address and port", kernel: "expression nat, module nft_nat", since: "3.13", write: probeDNAT},
		{name: "masquerade fully-random", kernel: "expression masq with NF_NAT_RANGE_PROTO_RANDOM_FULLY, module nft_masq",
			since: "4.2", write: probeMasquerade},
		{name: "sticky sets: a set with timeouts updated from the packet path",
			kernel: "NFT_SET_TIMEOUT|NFT_SET_EVAL, expressions dynset and lookup", since: "4.3", write: probeSticky},
		{name: "interval sets of concatenations", kernel: "NFT_SET_CONCAT, nft_set_pipapo", since: "5.6", intervals: true,
			write: probeIntervalConcat},
		{name: "table comments", kernel: "NFTA_TABLE_USERDATA", since: "5.10",
			kept: func(table string, echo []syscall.NetlinkMessage) bool {
				return echoHas(echo, unix.NFT_MSG_NEWTABLE, unix.NFTA_TABLE_NAME, table, nftaTableUserdata)
			}},
		{name: "chain comments", kernel: "NFTA_CHAIN_USERDATA", since: "5.10", write: probeChainComment,
			kept: func(_ string, echo []syscall.NetlinkMessage) bool {
				return echoHas(echo, unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_NAME, "probe-comment", nftaChainUserdata)
			}},
	}
}

// MissingFeatureError says which feature the kernel lacks.
type MissingFeatureError struct {
	Feature string // what the package writes, e.g. "chain comments"
	Kernel  string // the kernel's name for it: attribute, expression, module
	Since   string // the Linux release that brought it
	Family  Family
	Err     error // the kernel's refusal; nil when it ignored the feature
}

func (e *MissingFeatureError) Error() string {
	how := "it creates the object but drops the attribute"
	if e.Err != nil {
		how = e.Err.Error()
	}
	return fmt.Sprintf("the kernel's nf_tables lacks %s (%s, Linux %s+) in family %s: %s",
		e.Feature, e.Kernel, e.Since, e.Family, how)
}

func (e *MissingFeatureError) Unwrap() error { return e.Err }

// probeKernel is what the probe needs of a Kernel (tests fake it): one
// transaction, and the messages the kernel echoed.
type probeKernel interface {
	probeApply(b *batch) ([]syscall.NetlinkMessage, error)
}

func (k *Kernel) probeApply(b *batch) ([]syscall.NetlinkMessage, error) {
	defer k.finished(b)
	var echo []syscall.NetlinkMessage
	err := k.apply(b, func(m syscall.NetlinkMessage) { echo = append(echo, m) })
	return echo, err
}

// ProbeFeatures tries, in a scratch table of each family, every feature
// the package writes (interval sets of concatenations only with
// intervals), and returns a
// MissingFeatureError for the first one the kernel lacks. Each feature is
// one transaction that creates the scratch table and deletes it again, so
// nothing is ever left behind, whenever the process dies.
func (k *Kernel) ProbeFeatures(intervals bool) error {
	return probeFeatures(k, intervals, scratchTableName(), k.seq)
}

func probeFeatures(k probeKernel, intervals bool, table string, seq uint32) error {
	for _, f := range Families {
		for _, feat := range features() {
			if feat.intervals && !intervals {
				continue
			}
			b := newBatch(seq)
			writeProbe(b, f, table, feat)
			seq = b.seq
			echo, err := k.probeApply(b)
			if err != nil {
				var tx *TxError
				if !errors.As(err, &tx) || tx.Errno == unix.EPERM {
					return fmt.Errorf("probing nf_tables for %s: %w", feat.name, err)
				}
				return feat.missing(f, err)
			}
			if feat.kept != nil && !feat.kept(table, echo) {
				return feat.missing(f, nil)
			}
		}
	}
	return nil
}

func (feat feature) missing(f Family, err error) *MissingFeatureError {
	return &MissingFeatureError{Feature: feat.name, Kernel: feat.kernel, Since: feat.since, Family: f, Err: err}
}

// writeProbe writes one feature's transaction: create the scratch table
// (NLM_F_EXCL: never someone else's table of that name), the feature's
// objects, and delete the table.
func writeProbe(b *batch, f Family, table string, feat feature) {
	b.begin(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ECHO, f)
	b.str(unix.NFTA_TABLE_NAME, table)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	b.commentAttr(nftaTableUserdata, 0, probeComment)
	b.end()
	if feat.write != nil {
		feat.write(b, f, table)
	}
	b.DelTable(f, table)
}

// scratchTableName is unique to this process and run.
func scratchTableName() string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("kube-nftproxy-probe-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
}

// echoHas reports whether the echo holds a message of type typ whose
// nameAttr is name and which carries attribute want.
func echoHas(echo []syscall.NetlinkMessage, typ uint16, nameAttr uint16, name string, want uint16) bool {
	for _, m := range echo {
		if m.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|typ || len(m.Data) < NfgenLen {
			continue
		}
		var n string
		has := false
		forAttrs(m.Data[NfgenLen:], func(a nlAttr) {
			switch a.typ {
			case nameAttr:
				n = a.str()
			case want:
				has = len(a.data) > 0
			}
		})
		if n == name && has {
			return true
		}
	}
	return false
}
