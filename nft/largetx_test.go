package nft

import (
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// TestBackendOnLargeTx checks that OnLargeTx brackets the encoding and
// commit of a transaction of at least LargeTxRules rules, and only those: its
// done runs once the kernel holds the transaction, and a sync with
// nothing to write, or a smaller one, never calls it.
func TestBackendOnLargeTx(t *testing.T) {
	tests := []struct {
		name    string
		largeTx int
		want    int // calls over a full sync and a sync with no change
	}{
		{"every transaction is large", 1, 1},
		{"no transaction is large", 1 << 30, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls, dones int
			st := tinyState(map[string]string{"a": "10.0.0.1", "b": "10.0.0.2"})
			var k nftlib.FakeKernel
			onLargeTx := func() func() {
				calls++
				if k.String() != "" {
					t.Errorf("OnLargeTx called after the kernel got the transaction:\n%s", k.String())
				}
				return func() {
					dones++
					holdsFullSync(t, k, st, demoConfig())
				}
			}
			b, fk, _ := fakeBackend(t, BackendConfig{Strategy: Strategy{LargeTxRules: tc.largeTx, OnLargeTx: onLargeTx}})
			k = fk
			for range 2 {
				if _, err := b.Sync(t.Context(), st); err != nil {
					t.Fatal(err)
				}
			}
			if calls != tc.want || dones != tc.want {
				t.Errorf("OnLargeTx called %d times, its done %d times; want %d", calls, dones, tc.want)
			}
		})
	}
}
