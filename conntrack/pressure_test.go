package conntrack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// reading is one state of a fake /proc/sys: the two keys' contents, ""
// for a missing file.
type reading struct{ count, max string }

// pressureKernel is a fake /proc/sys holding the two keys.
type pressureKernel struct {
	t    *testing.T
	root string
}

func (k pressureKernel) set(r reading) {
	k.t.Helper()
	for key, v := range map[string]string{keyCount: r.count, keyMax: r.max} {
		p := filepath.Join(k.root, key)
		if v == "" {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				k.t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			k.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			k.t.Fatal(err)
		}
	}
}

// gauges is what the registry serves: "entries/limit", or "none".
func gauges(t *testing.T, reg metrics.KubeRegistry) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			v[f.GetName()] = m.GetGauge().GetValue()
		}
	}
	e, ok1 := v["kubenftproxy_conntrack_entries"]
	l, ok2 := v["kubenftproxy_conntrack_entries_limit"]
	if !ok1 || !ok2 {
		if ok1 || ok2 {
			return fmt.Sprintf("one of two: %v", v)
		}
		return "none"
	}
	return fmt.Sprintf("%g/%g", e, l)
}

// TestPressure feeds a sequence of readings to Check and wants, after
// each, the gauges served and the new log lines (level and message start).
func TestPressure(t *testing.T) {
	type step struct {
		r      reading
		gauges string
		logged []string
	}
	const (
		warn = "WARN conntrack table nearly full: at its limit the kernel drops packets of new connections"
		room = "INFO conntrack table has room again"
	)
	tests := []struct {
		name  string
		steps []step
	}{
		{"fills, hovers, empties, fills again", []step{
			{reading{"10", "1000"}, "10/1000", nil},
			{reading{"899", "1000"}, "899/1000", nil},
			{reading{"900", "1000"}, "900/1000", []string{warn + `|entries=900 limit=1000`}},
			{reading{"1000", "1000"}, "1000/1000", nil},
			{reading{"850", "1000"}, "850/1000", nil}, // between the thresholds: still high
			{reading{"950", "1000"}, "950/1000", nil},
			{reading{"800", "1000"}, "800/1000", nil},
			{reading{"799", "1000"}, "799/1000", []string{room + `|entries=799 limit=1000`}},
			{reading{"850", "1000"}, "850/1000", nil},
			{reading{"999", "1000"}, "999/1000", []string{warn + `|entries=999 limit=1000`}},
		}},
		{"full at start", []step{
			{reading{"256", "256"}, "256/256", []string{warn + `|entries=256 limit=256`}},
			{reading{"3", "256"}, "3/256", []string{room + `|entries=3 limit=256`}},
		}},
		{"the limit raised", []step{
			{reading{"240", "256"}, "240/256", []string{warn}},
			{reading{"240", "131072"}, "240/131072", []string{room}},
		}},
		{"no limit", []step{
			{reading{"5000", "0"}, "5000/0", nil},
		}},
		{"no conntrack, then loaded", []step{
			{reading{"", ""}, "none", nil},
			{reading{"", ""}, "none", nil},
			{reading{"0", "262144"}, "0/262144", nil},
			{reading{"", ""}, "none", nil},
		}},
		{"unreadable value logged once", []step{
			{reading{"x", "256"}, "none", []string{`WARN cannot read the conntrack table's fill`}},
			{reading{"x", "256"}, "none", nil},
			{reading{"250", "256"}, "250/256", []string{warn}},
			{reading{"x", "256"}, "none", []string{`WARN cannot read the conntrack table's fill`}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := pressureKernel{t: t, root: t.TempDir()}
			var logs bytes.Buffer
			reg := metrics.NewKubeRegistry()
			p := &Pressure{Sysctl: sysctl.New(k.root), Metrics: NewPressureMetrics(reg),
				Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
					ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
						if a.Key == slog.TimeKey {
							return slog.Attr{}
						}
						return a
					}}))}
			for i, s := range tt.steps {
				k.set(s.r)
				logs.Reset()
				p.Check()
				if got := gauges(t, reg); got != s.gauges {
					t.Errorf("step %d %+v: gauges %s, want %s", i, s.r, got, s.gauges)
				}
				lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
				if logs.Len() == 0 {
					lines = nil
				}
				if len(lines) != len(s.logged) {
					t.Errorf("step %d %+v: logged %q, want %q", i, s.r, lines, s.logged)
					continue
				}
				for j, want := range s.logged {
					// want is "LEVEL message start|attributes at the end".
					msg, attrs, _ := strings.Cut(want, "|")
					if got := normalizeLog(lines[j]); !strings.HasPrefix(got, msg) || !strings.HasSuffix(got, attrs) {
						t.Errorf("step %d %+v: logged %q, want %q", i, s.r, got, want)
					}
				}
			}
		})
	}
}

// normalizeLog turns `level=WARN msg="text: more" entries=1` into
// `WARN text: more entries=1`.
func normalizeLog(line string) string {
	level, rest, _ := strings.Cut(strings.TrimPrefix(line, "level="), " ")
	msg, attrs, _ := strings.Cut(strings.TrimPrefix(rest, "msg="), `" `)
	return level + " " + strings.TrimPrefix(msg, `"`) + " " + attrs
}

// TestPressureRun reads at once, then every period, until ctx ends.
func TestPressureRun(t *testing.T) {
	k := pressureKernel{t: t, root: t.TempDir()}
	k.set(reading{"1", "10"})
	reg := metrics.NewKubeRegistry()
	p := &Pressure{Sysctl: sysctl.New(k.root), Metrics: NewPressureMetrics(reg), Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx, 10*time.Millisecond); close(done) }()
	wait := func(want string) {
		t.Helper()
		testutil.WaitFor(t, 5*time.Second, "gauges "+want, func() bool { return gauges(t, reg) == want })
	}
	wait("1/10")
	k.set(reading{"7", "10"})
	wait("7/10")
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
}
