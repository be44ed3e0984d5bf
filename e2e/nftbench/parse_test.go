package nftbench

import (
	"os"
	"testing"
	"time"
)

func TestParseRuleset(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       rulesetCount
	}{
		{
			name: "only kube-* tables count",
			json: `{"nftables": [{"metainfo": {"json_schema_version": 1}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
{"table": {"family": "ip", "name": "filter", "handle": 2}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 1}},
{"chain": {"family": "ip", "table": "filter", "name": "OUTPUT", "handle": 1}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "expr": [{"dnat": {"addr": "100.64.0.1"}}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "OUTPUT", "expr": [{"accept": null}]}},
{"map": {"family": "ip", "table": "kube-proxy", "name": "service-ips", "elem": [["a", "b"], ["c", "d"]]}},
{"set": {"family": "ip", "table": "kube-proxy", "name": "cluster-ips", "elem": ["10.96.0.1", "100.127.255.255"]}},
{"set": {"family": "ip", "table": "filter", "name": "x", "elem": ["100.64.0.9"]}}]}`,
			want: rulesetCount{chains: 1, rules: 1, elements: 4, endpoints: 2},
		},
		{
			name: "the same address twice is one endpoint; outside 100.64.0.0/10 none",
			json: `{"nftables": [
{"rule": {"table": "kube-nftproxy", "comment": "100.64.0.1 100.64.0.1 100.128.0.1 100.63.255.255"}}]}`,
			want: rulesetCount{rules: 1, endpoints: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRuleset([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := parseRuleset([]byte("not json")); err == nil {
		t.Error("bad JSON parsed")
	}
}

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
