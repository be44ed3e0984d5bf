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
	m, err := DeployManifests(deployDir(), "img", "https://api:6443")
	if err != nil {
		t.Fatal(err)
	}
	out, err := withNodeSelector(m, switchedLabel, "true")
	if err != nil {
		t.Fatal(err)
	}
	want := "\n    spec:\n      nodeSelector:\n        " + switchedLabel + ": \"true\"\n"
	if strings.Count(out, want) != 1 {
		t.Errorf("no nodeSelector in the pod template:\n%s", out)
	}
	if _, err := withNodeSelector("kind: Service\n", "k", "v"); err == nil {
		t.Error("a manifest without a pod template: no error")
	}
}
