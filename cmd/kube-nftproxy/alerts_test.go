package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const alertRulesFile = "../../deploy/monitoring/alerts.yaml"

// ruleFile is Prometheus's rules file format, the parts we check.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// promQLWords are PromQL's keywords, which look like metric names.
var promQLWords = []string{"by", "without", "on", "ignoring", "group_left", "group_right",
	"and", "or", "unless", "bool", "offset", "inf", "nan"}

var (
	promQLStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promQLMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promQLRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promQLNumbers   = regexp.MustCompile(`\b[0-9][0-9a-zA-Z_.]*`) // 300, 1e3, 1h30m
	promQLGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promQLIdentWord = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
)

// metricNames are the metric names an expression selects: its
// identifiers less functions, keywords, label names and literals.
func metricNames(expr string) []string {
	e := promQLStrings.ReplaceAllString(expr, `""`)
	e = promQLMatchers.ReplaceAllString(e, " ")
	e = promQLRanges.ReplaceAllString(e, " ")
	e = promQLGrouping.ReplaceAllString(e, " ")
	e = promQLNumbers.ReplaceAllString(e, " ")
	var names []string
	for _, w := range promQLIdentWord.FindAllString(e, -1) {
		if strings.HasSuffix(w, "(") || slices.Contains(promQLWords, strings.ToLower(w)) || slices.Contains(names, w) {
			continue
		}
		names = append(names, w)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`up{job="kube-nftproxy"} == 0`, []string{"up"}},
		{`time() - max by (instance) (a_seconds) > 300`, []string{"a_seconds"}},
		{`sum by (instance) (increase(a_total[15m]) or increase(b_total{x="c_total"}[5m])) > 3`, []string{"a_total", "b_total"}},
		{`up == 1 unless on (instance, job) a`, []string{"up", "a"}},
		{`rate(h_bucket[5m]) offset 1h`, []string{"h_bucket"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

// servedMetric reports whether /metrics serves name: a family of the
// reference, a histogram's or summary's series of one, a family of
// metricGroups, or Prometheus's own up.
func servedMetric(name string, families []familyDoc) bool {
	if name == "up" || slices.ContainsFunc(metricGroups, func(p string) bool { return strings.HasPrefix(name, p) }) {
		return true
	}
	return slices.ContainsFunc(families, func(f familyDoc) bool {
		if f.name == name {
			return true
		}
		if f.kind != "histogram" && f.kind != "summary" {
			return false
		}
		return name == f.name+"_bucket" || name == f.name+"_sum" || name == f.name+"_count"
	})
}

// TestAlertRules parses deploy/monitoring/alerts.yaml and checks each
// alert: a name, an expression naming only metrics kube-nftproxy serves
// (from its real registry), a valid for, a severity and the annotations
// an operator reads.
func TestAlertRules(t *testing.T) {
	b, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", alertRulesFile, err)
	}
	families, err := referenceFamilies()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("group %s: an alert without a name, or named twice: %q", g.Name, r.Alert)
			}
			seen[r.Alert] = true
			names := metricNames(r.Expr)
			if len(names) == 0 {
				t.Errorf("%s: expression %q names no metric", r.Alert, r.Expr)
			}
			for _, n := range names {
				if !servedMetric(n, families) {
					t.Errorf("%s: %s is not a metric kube-nftproxy serves (expr %q)", r.Alert, n, r.Expr)
				}
			}
			if _, err := time.ParseDuration(r.For); r.For != "" && err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: wants a summary and a description", r.Alert)
			}
		}
	}
	// The failures the rules are for: the proxy down, syncs failing, rules
	// stale, the source of Services down.
	for _, want := range []string{"KubeNftproxyDown", "KubeNftproxySyncFailing", "KubeNftproxyRulesStale", "KubeNftproxySourceDown"} {
		if !seen[want] {
			t.Errorf("no alert %s in %s", want, alertRulesFile)
		}
	}
}
