package ipvs

import (
	"context"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// memLink is kube-ipvs0 in memory: the host has no dummy links.
type memLink struct{ addrs map[netip.Addr]bool }

func (l *memLink) Addrs() ([]netip.Addr, error) { return slices.Collect(maps.Keys(l.addrs)), nil }
func (l *memLink) AddAddrs(a []netip.Addr) error {
	for _, x := range a {
		l.addrs[x] = true
	}
	return nil
}
func (l *memLink) DelAddrs(a []netip.Addr) error {
	for _, x := range a {
		delete(l.addrs, x)
	}
	return nil
}

// handleRE finds a rule's handle (table and chain lines end in "{ # handle N").
var handleRE = regexp.MustCompile(`(?m)^\s+[^{]*# handle (\d+)$`)

// Tampering with the helper tables (nft, another process) is seen by the
// change monitor at once, reported for the table it touched, and repaired
// by the next sync: the tables then list exactly as before. Our own writes
// are not reported.
func TestKernelHelperDriftRepaired(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, ns string)
		table  string // the table reported
		want   string // in a reported difference
	}{
		{"chain flushed", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "flush", "chain", "ip", HelperTableName, chainIPVSFilter)
		}, "ip " + HelperTableName, "chain KUBE-IPVS-FILTER: 0 rules, want 6"},
		{"rule deleted", func(t *testing.T, ns string) {
			m := handleRE.FindStringSubmatch(testns.NFT(t, ns, "-a", "list", "chain", "ip6", HelperTableName, chainPostrouting))
			if m == nil {
				t.Fatal("no rule handle")
			}
			testns.NFT(t, ns, "delete", "rule", "ip6", HelperTableName, chainPostrouting, "handle", m[1])
		}, "ip6 " + HelperTableName, "chain KUBE-POSTROUTING"},
		{"element removed", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "delete", "element", "ip", HelperTableName, SetClusterIP, "{ 10.96.0.10 . udp . 53 }")
		}, "ip " + HelperTableName, "set KUBE-CLUSTER-IP: element 10.96.0.10 . udp . 53 missing"},
		{"foreign element added", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "add", "element", "ip", HelperTableName, SetIPVSIPs, "{ 10.1.2.3 }")
		}, "ip " + HelperTableName, "set KUBE-IPVS-IPS: element 10.1.2.3 is not ours"},
		{"rule with an anonymous set", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "add rule ip "+HelperTableName+" "+chainIPVSFilter+" ip saddr { 1.2.3.4, 5.6.7.8 } counter")
		}, "ip " + HelperTableName, "set __set0: not ours"},
		{"quota, ct helper and a counter used by a rule", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "add quota ip6 "+HelperTableName+" fq { over 25 mbytes }")
			testns.NFT(t, ns, `add ct helper ip6 `+HelperTableName+` fh { type "ftp" protocol tcp; }`)
			testns.NFT(t, ns, "add counter ip6 "+HelperTableName+" fc")
			testns.NFT(t, ns, "add rule ip6 "+HelperTableName+" "+chainIPVSFilter+" counter name fc")
		}, "ip6 " + HelperTableName, "ct helper fh: not ours"},
		{"table deleted", func(t *testing.T, ns string) {
			testns.NFT(t, ns, "delete", "table", "ip6", HelperTableName)
		}, "ip6 " + HelperTableName, "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-ipvs-")
			k, err := nftlib.OpenKernel(testns.Path(ns))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { k.Close() })
			changed := make(chan struct{}, 1)
			drifts := map[string][]string{}
			st := helperState()
			b := NewBackend(ipvsnl.NewFakeKernel(), BackendConfig{
				NodeAddrs: func() ([]netip.Addr, error) { return nodeAddrs, nil },
				NewHelper: func(n model.Node) (Helper, error) {
					return NewNftHelper(k, helperConfig(), n, &memLink{addrs: map[netip.Addr]bool{}}), nil
				},
				CheckEvery: time.Hour, // only the monitor triggers a check here
				Watch: func(onChange func()) (ChangeMonitor, error) {
					// k.Close, at the test's end, closes the monitor.
					if err := k.Watch(HelperTableRefs(), nftlib.MonitorRcvBuf, onChange); err != nil {
						return nil, err
					}
					return k.Monitor(), nil
				},
				OnForeignChange: func() {
					select {
					case changed <- struct{}{}:
					default:
					}
				},
				OnDrift: func(table string, diffs []string) { drifts[table] = append(drifts[table], diffs...) },
			})
			sync := func() {
				t.Helper()
				if _, err := b.Sync(context.Background(), st); err != nil {
					t.Fatal(err)
				}
			}
			sync()
			before := testutil.SortedText(testns.NFT(t, ns, "list", "ruleset"))
			// Our own writes (the first sync's) are no foreign change.
			sync()
			select {
			case <-changed:
				t.Fatal("the monitor reported our own writes")
			default:
			}
			if len(drifts) != 0 {
				t.Fatalf("drift reported without tampering: %v", drifts)
			}

			tc.tamper(t, ns)
			select {
			case <-changed:
			case <-time.After(5 * time.Second):
				t.Fatal("the change monitor did not report the change")
			}
			if testutil.SortedText(testns.NFT(t, ns, "list", "ruleset")) == before {
				t.Fatal("the tampering changed nothing")
			}
			sync()
			if d := strings.Join(drifts[tc.table], "\n"); !strings.Contains(d, tc.want) {
				t.Errorf("differences reported for %s: %q, want one with %q (all: %v)", tc.table, d, tc.want, drifts)
			}
			if got := testutil.SortedText(testns.NFT(t, ns, "list", "ruleset")); got != before {
				t.Errorf("after the repair:\n%s\n--- want:\n%s", got, before)
			}
			clear(drifts)
			sync()
			if len(drifts) != 0 {
				t.Errorf("drift reported after the repair: %v", drifts)
			}
		})
	}
}
