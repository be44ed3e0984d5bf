package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStreamStatsGaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	fail := errors.New("timeout")
	for _, tc := range []struct {
		name           string
		events         []error // one request every 100 ms from 100 ms on
		stop           int     // ms
		failed         int
		longest, endAt int // ms
	}{
		{"all answered", []error{nil, nil, nil}, 300, 0, 100, 100},
		{"an outage in the middle", []error{nil, fail, fail, nil, nil}, 500, 2, 300, 400},
		{"failing at the end", []error{nil, nil, fail, fail}, 1000, 2, 800, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &streamStats{lastOK: t0}
			for i, err := range tc.events {
				s.record(err, 10*time.Millisecond, at(100*(i+1)))
			}
			s.closeGap(at(tc.stop))
			if s.requests != len(tc.events) || s.failed != tc.failed {
				t.Errorf("requests %d failed %d, want %d and %d", s.requests, s.failed, len(tc.events), tc.failed)
			}
			if s.longestGap != time.Duration(tc.longest)*time.Millisecond || !s.gapEnd.Equal(at(tc.endAt)) {
				t.Errorf("longest gap %v ending at %v, want %dms ending at %dms", s.longestGap, s.gapEnd.Sub(t0), tc.longest, tc.endAt)
			}
		})
	}
}

func TestWithNodeSelector(t *testing.T) {
	deploy, err := DeployManifests(deployDir(), "img", "https://api:6443")
	if err != nil {
		t.Fatal(err)
	}
	const ds = "kind: DaemonSet\nspec:\n  template:\n    metadata:\n      labels:\n        a: b\n    spec:\n"
	for _, tc := range []struct{ name, in, want string }{
		{"deploy/", deploy, "        " + switchedLabel + ": \"true\"\n"},
		{"no nodeSelector", ds + "      hostNetwork: true\n",
			ds + "      nodeSelector:\n        " + switchedLabel + ": \"true\"\n      hostNetwork: true\n"},
		{"a nodeSelector", ds + "      nodeSelector:\n        kubernetes.io/os: linux\n      hostNetwork: true\n",
			ds + "      nodeSelector:\n        " + switchedLabel + ": \"true\"\n        kubernetes.io/os: linux\n      hostNetwork: true\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := withNodeSelector(tc.in, switchedLabel, "true")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, tc.want) || strings.Count(out, "nodeSelector:") != 1 {
				t.Errorf("got\n%s\nwant it to hold\n%s\nwith one nodeSelector", out, tc.want)
			}
		})
	}
	if _, err := withNodeSelector("kind: Service\n", "k", "v"); err == nil {
		t.Error("a manifest without a pod template: no error")
	}
}

// TestWithProxyMode: deploy/'s --proxy-mode=nftables becomes
// --proxy-mode=iptables in both containers, and a manifest without that flag is refused.
func TestWithProxyMode(t *testing.T) {
	m, err := DeployManifests(deployDir(), "img", "https://10.200.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	got, err := withProxyMode(m, "iptables")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(got, "        - --proxy-mode=iptables\n") != 2 || strings.Count(got, "--proxy-mode") != 2 {
		t.Errorf("not --proxy-mode=iptables in both the init container and the proxy:\n%s", got)
	}
	if _, err := withProxyMode("kind: DaemonSet\n", "iptables"); err == nil {
		t.Error("a manifest without --proxy-mode=nftables was taken")
	}
}
