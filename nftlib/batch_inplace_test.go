package nftlib

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// The batch encodes each message in place at the end of its last chunk;
// a message that outgrows the room left there moves to the heap and is
// copied. Whatever the sizes, the batch's bytes must be its messages one
// after the other, each as encoded alone, numbered in turn; also when
// parts encoded apart are joined (writeEach).
func TestBatchInPlace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		elems []int // one element message per entry, with that many elements
	}{
		{"small", []int{1, 2, 3}},
		{"fills chunks", repeat(40, 200)},                 // 16 KiB chunks, many of them
		{"outgrows the room", append(repeat(5, 60), 256)}, // a 10 KiB message after many small ones
		{"largest first", []int{256, 1, 256, 3, 256, 256, 256}},
		{"in parts", repeat(1, 2*ParallelMin+100)}, // writeEach encodes parts apart and joins them
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, parallel := range []bool{false, true} {
				b := newBatch(7)
				want := [][]byte{alone(newBatch(7))}
				write := func(m *batch, i int) { m.Elements(true, IPv4, "t", testMap, elements(i, tc.elems[i])) }
				for i := range tc.elems {
					m := &batch{seq: uint32(8 + i)}
					write(m, i)
					want = append(want, alone(m))
				}
				if parallel {
					b.writeEach(len(tc.elems), func(int) int { return 1 }, write)
				} else {
					for i := range tc.elems {
						write(b, i)
					}
				}
				if b.Messages() != len(tc.elems) {
					t.Errorf("Messages() = %d, want %d", b.Messages(), len(tc.elems))
				}
				chunks, _, err := b.finish()
				if err != nil {
					t.Fatal(err)
				}
				got := bytes.Join(chunks, nil)
				got = stripAck(got[:len(got)-(nlmsgHdrLen+NfgenLen)]) // batch end; the last message's ack
				if w := bytes.Join(want, nil); !bytes.Equal(got, w) {
					t.Fatalf("parallel=%v: the batch's %d bytes differ from its messages' %d encoded one by one", parallel, len(got), len(w))
				}
			}
		})
	}
}

var testMap = &Map{Name: "m", Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}}

func elements(seed, n int) []Element {
	out := make([]Element, n)
	for i := range out {
		out[i] = Element{Key: Key{Addr: netip.AddrFrom4([4]byte{10, byte(seed), byte(i >> 8), byte(i)}), Proto: 6, Port: uint16(i)},
			Verdict: Verdict{Kind: Jump, Chain: "KUBE-SVC-ABCDEFGHIJKLMNOP"}}
	}
	return out
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1 + v*(i%3)
	}
	return out
}

// alone returns the message m holds.
func alone(m *batch) []byte {
	m.flushMessage()
	return bytes.Join(m.chunks, nil)
}

// stripAck clears NLM_F_ACK in every message header of msgs (Finish sets
// it on the last one).
func stripAck(msgs []byte) []byte {
	out := bytes.Clone(msgs)
	for off := 0; off+nlmsgHdrLen <= len(out); {
		l := int(binary.NativeEndian.Uint32(out[off:]))
		if l < nlmsgHdrLen {
			break
		}
		flags := binary.NativeEndian.Uint16(out[off+6:])
		binary.NativeEndian.PutUint16(out[off+6:], flags&^unix.NLM_F_ACK)
		off += l
	}
	return out
}
