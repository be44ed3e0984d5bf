package ipvsnl

import (
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// SET_CONFIG carries only the timeouts that are set, in seconds.
func TestSetConfigEncoding(t *testing.T) {
	b := appendSetConfig(nil, 0x22, 7, Timeouts{TCP: 900 * time.Second, UDP: 300*time.Second + 500*time.Millisecond})
	hdr := 16 + 4
	if len(b) != hdr+8+8 {
		t.Fatalf("message of %d bytes, want header and two u32 attributes", len(b))
	}
	if b[16] != cmdSetConfig {
		t.Errorf("command %d, want %d", b[16], cmdSetConfig)
	}
	got := map[uint16]uint32{}
	nlmsg.Walk(b[hdr:], func(typ uint16, data []byte) {
		got[typ] = uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
	})
	if len(got) != 2 || got[attrCmdTimeoutTCP] != 900 || got[attrCmdTimeoutUDP] != 300 {
		t.Errorf("attributes %v, want tcp 900 and udp 300", got)
	}
	if !(Timeouts{TCPFin: 500 * time.Millisecond}).IsZero() || (Timeouts{TCPFin: time.Second}).IsZero() {
		t.Error("IsZero")
	}
}
