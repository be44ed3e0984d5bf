package nftbench

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four is the second", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"max", ms(hundred...), 1, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

// notification builds one nf_tables notification of message type typ with
// payload after the 4-byte nfgenmsg.
func notification(typ uint16, payload []byte) []byte {
	body := append([]byte{unix.AF_INET, 0, 0, 0}, payload...)
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(b[4:], unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	return append(b, body...)
}

func TestScanNewObjects(t *testing.T) {
	ip := []byte{100, 112, 0, 7}
	aligned := append([]byte{8, 0, 1, 0}, ip...)        // an attribute holding the address
	unaligned := append([]byte{9, 0, 1, 0, 'x'}, ip...) // the same bytes inside a string
	unaligned = append(unaligned, 0, 0, 0)
	tests := []struct {
		name string
		msgs [][]byte
		want bool
	}{
		{"a new rule's value", [][]byte{notification(unix.NFT_MSG_NEWRULE, aligned)}, true},
		{"a new element's key", [][]byte{notification(unix.NFT_MSG_NEWSETELEM, aligned)}, true},
		{"a deleted rule", [][]byte{notification(unix.NFT_MSG_DELRULE, aligned)}, false},
		{"a new chain", [][]byte{notification(unix.NFT_MSG_NEWCHAIN, aligned)}, false},
		{"not aligned", [][]byte{notification(unix.NFT_MSG_NEWRULE, unaligned)}, false},
		{"second of a batch", [][]byte{notification(unix.NFT_MSG_NEWGEN, nil), notification(unix.NFT_MSG_NEWRULE, aligned)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			found := false
			err := scanNewObjects(slices.Concat(tt.msgs...), func(w [4]byte) {
				found = found || w == [4]byte(ip)
			})
			if err != nil {
				t.Fatal(err)
			}
			if found != tt.want {
				t.Errorf("found %v, want %v", found, tt.want)
			}
		})
	}
	truncated := notification(unix.NFT_MSG_NEWRULE, aligned)
	if err := scanNewObjects(truncated[:len(truncated)-4], func([4]byte) {}); err == nil {
		t.Error("a truncated message parsed")
	}
}

func TestParseRxBytes(t *testing.T) {
	const dev = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0
  api0: 5348291    4021    0    0    0     0          0         0   212345    2011    0    0    0     0       0          0
`
	tests := []struct {
		dev     string
		want    int64
		wantErr bool
	}{{"api0", 5348291, false}, {"lo", 120, false}, {"eth0", 0, true}}
	for _, tt := range tests {
		got, err := parseRxBytes(dev, tt.dev)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got %d, %v; want %d (error %v)", tt.dev, got, err, tt.want, tt.wantErr)
		}
	}
}
