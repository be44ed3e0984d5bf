package main

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestLargeTxMemory checks that largeTxMemory sets a soft memory limit a
// little above what the runtime holds, never above one already set
// (GOMEMLIMIT), and that its done puts the previous limit back.
func TestLargeTxMemory(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	tests := []struct {
		name  string
		prior int64
		lower bool // whether the limit during the transaction is below prior
	}{
		{"no limit before", math.MaxInt64, true},
		{"a lower limit kept", 1 << 20, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(tc.prior)
			done := largeTxMemory()
			during := debug.SetMemoryLimit(-1)
			held := runtimeHeld()
			done()
			if after := debug.SetMemoryLimit(-1); after != tc.prior {
				t.Errorf("limit after done = %d, want the prior %d", after, tc.prior)
			}
			switch {
			case !tc.lower && during != tc.prior:
				t.Errorf("limit during = %d, want the prior %d kept", during, tc.prior)
			case tc.lower && (during >= tc.prior || during < held):
				t.Errorf("limit during = %d, want between the runtime's %d and %d", during, held, tc.prior)
			}
		})
	}
}
