package nftlib

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
)

// fuzzTable is stageTable(n) with names and comments taken from data: any
// bytes, any length, as a caller could pass them.
func fuzzTable(data []byte) *Table {
	t := stageTable(int(len(data) % 7))
	t.Comment = string(data)
	i := 0
	for _, fr := range t.Fragments {
		for _, c := range fr.Chains {
			c.Comment = fmt.Sprintf("%s/%x", data, i)
			for j := range fr.Elements {
				fr.Elements[j].Comment = c.Comment
				fr.Elements[j].Element.Key.Addr = netip.AddrFrom4([4]byte{10, byte(i), byte(len(data)), 1})
			}
		}
		i++
	}
	return t
}

// FuzzTxEncode: a full transaction of a table, whatever its comments,
// encodes without a panic as well-formed netlink messages whose attributes
// parse.
func FuzzTxEncode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("ns/svc:port \"quoted\" \\ \n\x00\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		x, _ := FullTx(fuzzTable(data), &KernelTable{}, false)
		bt := newBatch(1)
		var setID uint32
		x.Write(bt, &setID)
		chunks, _, err := bt.finish()
		if err != nil {
			t.Fatalf("encoding: %v", err)
		}
		var all []byte
		for _, c := range chunks {
			all = append(all, c...)
		}
		msgs, err := syscall.ParseNetlinkMessage(all)
		if err != nil {
			t.Fatalf("the batch does not parse as netlink messages: %v", err)
		}
		for _, m := range msgs[1 : len(msgs)-1] { // between batch begin and end
			if !forAttrs(m.Data[NfgenLen:], func(nlAttr) {}) {
				t.Fatalf("malformed attributes in message type %#x", m.Header.Type)
			}
		}
	})
}
