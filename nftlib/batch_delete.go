package nftlib

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// DelRule deletes the rule of a chain with that handle (as ListRules
// reports it): a rule of another program's, whose expressions we never
// decode.
func (b *batch) DelRule(f Family, table, chain string, handle uint64) {
	b.begin(unix.NFT_MSG_DELRULE, 0, f)
	b.str(unix.NFTA_RULE_TABLE, table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	b.attr(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle))
	b.end()
}

// DelRule writes a rule deletion as nft does.
func (s *scriptWriter) DelRule(f Family, table, chain string, handle uint64) {
	s.line("delete rule %s %s %s handle %d", f, table, chain, handle)
}

// describeRuleDeletion says what a DELRULE message does: it deletes one
// rule when it names a handle, and flushes the chain (or the table) when
// it does not.
func describeRuleDeletion(attrs []byte) string {
	chain, _ := findAttr(attrs, unix.NFTA_RULE_CHAIN)
	name := string(trimNUL(chain))
	if h, ok := findAttr(attrs, unix.NFTA_RULE_HANDLE); ok && len(h) == 8 {
		return fmt.Sprintf("delete rule %s handle %d", name, binary.BigEndian.Uint64(h))
	}
	if name == "" {
		table, _ := findAttr(attrs, unix.NFTA_RULE_TABLE)
		return "flush table " + string(trimNUL(table))
	}
	return "flush chain " + name
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
