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

// MinKernel is the oldest Linux release whose nf_tables has every Feature
// the proxy programs: table and chain comments came last, in 5.10.
const MinKernel = "5.10"

// Feature is one thing of nf_tables that the proxy programs, and what a
// kernel without it lacks.
type Feature struct {
	Name   string // what the proxy uses, e.g. "chain comments"
	Kernel string // the kernel's name for it: attribute, expression, module
	Since  string // the Linux release that brought it
	IPVS   bool   // needed by the IPVS mode only
	// write adds the objects that use the feature to the scratch table,
	// which the probe creates (with a comment) before and deletes after.
	write func(b *Batch, f Family, table string)
	// kept, for a feature that an older kernel ignores without an error
	// (an attribute it does not know), checks the kernel's echo of the
	// objects written with NLM_F_ECHO.
	kept func(table string, echo []syscall.NetlinkMessage) bool
}

// probeComment is the scratch table's and chain's comment, which the kernel
// must echo back.
const probeComment = "kube-nftproxy feature probe"

// features lists what the proxy programs, in the order probed: the oldest
// and most basic first, so that the error names the first thing missing.
func features() []Feature {
	return []Feature{
		{Name: "tables of this family", Kernel: "CONFIG_NF_TABLES_IPV4, CONFIG_NF_TABLES_IPV6", Since: "3.13"},
		{Name: "base chains of type nat", Kernel: "chain type nat, module nft_chain_nat", Since: "3.13",
			write: probeBaseChains},
		{Name: "verdict maps with concatenated keys: ip daddr . meta l4proto . th dport vmap",
			Kernel: "NFT_SET_MAP with a concatenation, nft_set_hash", Since: "4.1", write: probeVmap},
		{Name: "packet marks and interface names: meta mark set, iifname", Kernel: "expressions meta and bitwise", Since: "3.13",
			write: probeTerms(MarkSet{Bit: 0x4000}, MarkZero{Bit: 0x4000}, IfName{Name: "probe", Prefix: true})},
		{Name: "conntrack state: ct state new", Kernel: "expression ct, module nft_ct", Since: "3.13",
			write: probeTerms(CtState{Bits: 8})},
		{Name: "fib: fib daddr type local", Kernel: "expression fib, modules nft_fib_ipv4 and nft_fib_ipv6", Since: "4.10",
			write: probeTerms(FibLocal{})},
		{Name: "reject", Kernel: "expression reject, modules nft_reject_ipv4 and nft_reject_ipv6", Since: "3.14",
			write: probeReject},
		{Name: "random numbers: numgen random", Kernel: "expression numgen, module nft_numgen", Since: "4.9",
			write: probeTerms(NumgenZero{Mod: 2})},
		{Name: "DNAT to an address and port", Kernel: "expression nat, module nft_nat", Since: "3.13", write: probeDNAT},
		{Name: "masquerade fully-random", Kernel: "expression masq with NF_NAT_RANGE_PROTO_RANDOM_FULLY, module nft_masq",
			Since: "4.2", write: probeMasquerade},
		{Name: "sticky sets: a set with timeouts updated from the packet path",
			Kernel: "NFT_SET_TIMEOUT|NFT_SET_EVAL, expressions dynset and lookup", Since: "4.3", write: probeSticky},
		{Name: "interval sets of concatenations", Kernel: "NFT_SET_CONCAT, nft_set_pipapo", Since: "5.6", IPVS: true,
			write: probeIntervalConcat},
		{Name: "table comments", Kernel: "NFTA_TABLE_USERDATA", Since: "5.10",
			kept: func(table string, echo []syscall.NetlinkMessage) bool {
				return echoHas(echo, unix.NFT_MSG_NEWTABLE, unix.NFTA_TABLE_NAME, table, nftaTableUserdata)
			}},
		{Name: "chain comments", Kernel: "NFTA_CHAIN_USERDATA", Since: "5.10", write: probeChainComment,
			kept: func(_ string, echo []syscall.NetlinkMessage) bool {
				return echoHas(echo, unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_NAME, "probe-comment", nftaChainUserdata)
			}},
	}
}

// MissingFeatureError says which feature the kernel lacks and what the
// proxy needs.
type MissingFeatureError struct {
	Feature Feature
	Family  Family
	Err     error // the kernel's refusal; nil when it ignored the feature
}

func (e *MissingFeatureError) Error() string {
	how := "it creates the object but drops the attribute"
	if e.Err != nil {
		how = e.Err.Error()
	}
	return fmt.Sprintf("the kernel's nf_tables lacks %s (%s, Linux %s+) in family %s: %s; "+
		"kube-nftproxy needs Linux %s or later with nf_tables and its expression modules",
		e.Feature.Name, e.Feature.Kernel, e.Feature.Since, e.Family, how, MinKernel)
}

func (e *MissingFeatureError) Unwrap() error { return e.Err }

// probeKernel is what the probe needs of a Kernel (tests fake it): one
// transaction, and the messages the kernel echoed.
type probeKernel interface {
	probeApply(b *Batch) ([]syscall.NetlinkMessage, error)
}

func (k *Kernel) probeApply(b *Batch) ([]syscall.NetlinkMessage, error) {
	defer k.Finished(b)
	var echo []syscall.NetlinkMessage
	err := k.apply(b, func(m syscall.NetlinkMessage) { echo = append(echo, m) })
	return echo, err
}

// ProbeFeatures tries, in a scratch table of each family, every feature
// the proxy programs (with ipvs, the IPVS mode's too), and returns a
// MissingFeatureError for the first one the kernel lacks. Each feature is
// one transaction that creates the scratch table and deletes it again, so
// nothing is ever left behind, whenever the process dies.
func (k *Kernel) ProbeFeatures(ipvs bool) error {
	return probeFeatures(k, ipvs, scratchTableName(), k.seq)
}

func probeFeatures(k probeKernel, ipvs bool, table string, seq uint32) error {
	for _, f := range Families {
		for _, feat := range features() {
			if feat.IPVS && !ipvs {
				continue
			}
			b := newBatch(seq)
			writeProbe(b, f, table, feat)
			seq = b.seq
			echo, err := k.probeApply(b)
			if err != nil {
				var tx *TxError
				if !errors.As(err, &tx) || tx.Errno == unix.EPERM {
					return fmt.Errorf("probing nf_tables for %s: %w", feat.Name, err)
				}
				return &MissingFeatureError{Feature: feat, Family: f, Err: err}
			}
			if feat.kept != nil && !feat.kept(table, echo) {
				return &MissingFeatureError{Feature: feat, Family: f}
			}
		}
	}
	return nil
}

// writeProbe writes one feature's transaction: create the scratch table
// (NLM_F_EXCL: never someone else's table of that name), the feature's
// objects, and delete the table.
func writeProbe(b *Batch, f Family, table string, feat Feature) {
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
