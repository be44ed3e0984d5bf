package nftbench

import (
	"os"
	"testing"
	"time"
)

func TestSyncStarted(t *testing.T) {
	path := t.TempDir() + "/log"
	log := `I1123 12:26:23.018041    5004 proxier.go:1180] "Not syncing nftables until Services and Endpoints have been received from master" ipFamily="IPv4"
I1123 12:26:23.056496    5004 proxier.go:1206] "Syncing nftables rules" ipFamily="IPv4" fullSync=true
I1123 12:26:24.056496    5004 proxier.go:1206] "Syncing nftables rules" ipFamily="IPv6" fullSync=true
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	at, ok := syncStarted(path)
	if !ok {
		t.Fatal("no sync start found")
	}
	if at.Month() != time.November || at.Day() != 23 || at.Hour() != 12 || at.Minute() != 26 ||
		at.Second() != 23 || at.Nanosecond() != 56496000 || at.Year() != time.Now().Year() {
		t.Errorf("got %v", at)
	}
	if err := os.WriteFile(path, []byte(log[:140]), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := syncStarted(path); ok {
		t.Error("a sync start found in a log without one")
	}
}
