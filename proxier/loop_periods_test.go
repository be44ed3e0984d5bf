package proxier

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// A zero or negative sync period is refused by Run at once: the periodic
// timer would otherwise fire without pause and sync in a tight loop
// (350k syncs in 6 s were seen). A zero MinSyncPeriod is allowed, as in
// kube-proxy (every change syncs at once).
func TestLoopRefusesBadPeriods(t *testing.T) {
	for _, tc := range []struct {
		name           string
		minSync, sync  time.Duration
		wantRunRefused bool
	}{
		{"sync period 0", 0, 0, true},
		{"sync period negative", 0, -time.Second, true},
		{"min sync period negative", -time.Second, time.Minute, true},
		{"min sync period 0", 0, time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			l := NewLoop(b, nil)
			l.MinSyncPeriod, l.SyncPeriod = tc.minSync, tc.sync
			l.SetState(model.NewState())
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := l.Run(ctx)
			if tc.wantRunRefused {
				if err == nil || !strings.Contains(err.Error(), "must be greater than") {
					t.Errorf("Run = %v, want a refusal of the periods", err)
				}
				if n := b.count(); n != 0 {
					t.Errorf("%d syncs with refused periods, want none", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			// The first sync, and nothing more without a change.
			if n := b.count(); n != 1 {
				t.Errorf("%d syncs in 300ms with no change and a zero MinSyncPeriod, want 1", n)
			}
		})
	}
}
