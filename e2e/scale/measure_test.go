package scale

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestParseHistogram(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       Histogram
		wantErr    bool
	}{
		{
			name: "ours, no label",
			page: `# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum 0.25
kubeproxy_sync_proxy_rules_duration_seconds_count 3
kubeproxy_sync_full_proxy_rules_duration_seconds_sum 9
`,
			want: Histogram{Sum: 0.25, Count: 3},
		},
		{
			name: "upstream, IPv4 series only",
			page: `kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 7
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 9
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 14.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2
`,
			want: Histogram{Sum: 14.5, Count: 2},
		},
		{name: "absent before the first sync", page: "process_cpu_seconds_total 1\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHistogram(strings.NewReader(tc.page), SyncMetric)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestHistogramSince(t *testing.T) {
	mean, n := Histogram{Sum: 3.5, Count: 5}.Since(Histogram{Sum: 0.5, Count: 2})
	if n != 3 || mean != 1 {
		t.Errorf("Since = %v, %d; want 1, 3", mean, n)
	}
	if _, n := (Histogram{Count: 2}).Since(Histogram{Count: 2}); n != 0 {
		t.Errorf("no new observation: n = %d", n)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with a space and a parenthesis; utime 250, stime 50,
	// cutime 30, cstime 20 ticks.
	line := "1234 (kube proxy) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 12 0 100 1000 200"
	u, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds != 3 || u.ChildCPUSeconds != 0.5 {
		t.Errorf("got %+v, want 3 s own, 0.5 s children", u)
	}
	if _, err := parseStat("1234 (short) S 1 2"); err == nil {
		t.Error("a short line parsed")
	}
}

func TestParseSwitches(t *testing.T) {
	status := "Name:\tkube-proxy\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n"
	if got := parseSwitches(status); got != 127 {
		t.Errorf("parseSwitches = %d, want 127", got)
	}
	if got := parseSwitches("Name:\tx\n"); got != 0 {
		t.Errorf("parseSwitches without the fields = %d, want 0", got)
	}
}

func TestProcessActivitySelf(t *testing.T) {
	a, err := ProcessActivity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if a.Switches <= 0 {
		t.Errorf("this process has %d context switches", a.Switches)
	}
}

func TestShapes(t *testing.T) {
	for _, tc := range []struct {
		spec, want string
		bad        bool
	}{
		{spec: "", want: "[1000 x 10 5000 x 10 10000 x 10]"},
		{spec: "5000x50, 44000x1,100000", want: "[5000 x 50 44000 x 1 100000 x 10]"},
		{spec: "5000x", bad: true},
		{spec: "x5", bad: true},
		{spec: "5000x0", bad: true},
		{spec: "5k", bad: true},
	} {
		got, err := Shapes(tc.spec, 10)
		if (err != nil) != tc.bad || !tc.bad && fmt.Sprint(got) != tc.want {
			t.Errorf("Shapes(%q) = %v, %v; want %s (error: %v)", tc.spec, got, err, tc.want, tc.bad)
		}
	}
}
