package nlmsg

import (
	"bytes"
	"testing"
)

// Attributes are padded to 4 bytes, nests carry their whole length, and
// Walk reads back what was built, flags cleared.
func TestAttrsRoundTrip(t *testing.T) {
	var a Attrs
	a.Put(1, 'a', 'b', 'c')
	a.Nest(2, func(a *Attrs) {
		a.U16(3, 0x0102)
		a.BE16(4, 0x0102)
	})
	a.U32(5, 7)
	if len(a)%4 != 0 {
		t.Fatalf("attributes of %d bytes, want a multiple of 4", len(a))
	}
	type got struct {
		typ  uint16
		data []byte
	}
	var top []got
	Walk(a, func(typ uint16, data []byte) { top = append(top, got{typ, append([]byte(nil), data...)}) })
	if len(top) != 3 || top[0].typ != 1 || !bytes.Equal(top[0].data, []byte("abc")) || top[1].typ != 2 || top[2].typ != 5 {
		t.Fatalf("walked %+v", top)
	}
	var inner []uint16
	Walk(top[1].data, func(typ uint16, data []byte) { inner = append(inner, typ) })
	if len(inner) != 2 || inner[0] != 3 || inner[1] != 4 {
		t.Errorf("nested attributes %v, want [3 4]", inner)
	}
	// A truncated attribute ends the walk instead of reading past it.
	n := 0
	Walk(a[:5], func(uint16, []byte) { n++ })
	if n != 0 {
		t.Errorf("walked %d attributes of a truncated buffer", n)
	}
}

func TestEachMessageRejectsMalformed(t *testing.T) {
	msg := make([]byte, HdrLen)
	msg[0] = 200 // says 200 bytes, has 16
	if err := EachMessage(msg, func(uint16, uint32, []byte) {}); err == nil {
		t.Error("a message longer than its datagram was accepted")
	}
}
