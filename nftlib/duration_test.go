package nftlib

import (
	"testing"
	"time"
)

// A duration as nft prints it: its units from days down, no zero parts.
func TestNftDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10800 * time.Second: "3h", 90 * time.Second: "1m30s", 86400 * time.Second: "1d",
		10 * time.Second: "10s", 3723 * time.Second: "1h2m3s", 1500 * time.Millisecond: "1s500ms",
	} {
		if got := nftDuration(d); got != want {
			t.Errorf("nftDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
