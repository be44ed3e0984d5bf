package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/localnodeport"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
)

// updating is -update, the flag internal/golden defines for the
// package's golden files: it also rewrites docs/metrics.md's table.
func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

const metricsDoc = "../../docs/metrics.md"

// The generated table of docs/metrics.md sits between these lines.
const (
	metricsTableBegin = "<!-- BEGIN GENERATED TABLE: go test ./cmd/kube-nftproxy -run TestMetricsReference -update -->"
	metricsTableEnd   = "<!-- END GENERATED TABLE -->"
)

// metricGroups are the process-wide families documented by prefix rather
// than one by one: the Go runtime's and the process's collectors (their
// set follows the Go release) and client-go's (a family appears once a
// request of its kind was made).
var metricGroups = []string{"go_", "process_", "rest_client_"}

// localhostConfig is nftables mode with localhost NodePorts (gate
// KubeProxyNFTablesLocalhostNodePorts, a loopback --nodeport-addresses).
const localhostConfig = "nftables with localhost NodePorts"

// familyDoc is one row of the reference.
type familyDoc struct {
	name, kind, stability, help string
	labels                      []string
	served                      []string // the configurations that register it
}

// recordingRegistry is a KubeRegistry that keeps what is registered in
// it: a vector without a child is not gathered, so the reference creates
// one in each.
type recordingRegistry struct {
	metrics.KubeRegistry
	collectors []prometheus.Collector
}

func (r *recordingRegistry) MustRegister(cs ...metrics.Registerable) {
	r.KubeRegistry.MustRegister(cs...)
	for _, c := range cs {
		r.collectors = append(r.collectors, c)
	}
}

func (r *recordingRegistry) Register(c metrics.Registerable) error {
	r.collectors = append(r.collectors, c)
	return r.KubeRegistry.Register(c)
}

func (r *recordingRegistry) Registerer() prometheus.Registerer {
	return recordingRegisterer{r.KubeRegistry.Registerer(), r}
}

// recordingRegisterer is the plain prometheus side of recordingRegistry
// (leftover's counters).
type recordingRegisterer struct {
	prometheus.Registerer
	rec *recordingRegistry
}

func (r recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.Registerer.MustRegister(cs...)
	r.rec.collectors = append(r.rec.collectors, cs...)
}

func (r recordingRegisterer) Register(c prometheus.Collector) error {
	r.rec.collectors = append(r.rec.collectors, c)
	return r.Registerer.Register(c)
}

// variableLabels reads a collector's label names from its descriptions
// (prometheus.Desc has no accessor but String).
var variableLabelsRE = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

func labelCount(c prometheus.Collector) int {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	n := 0
	for d := range ch {
		if m := variableLabelsRE.FindStringSubmatch(d.String()); m != nil && m[1] != "" {
			n = strings.Count(m[1], ",") + 1
		}
	}
	return n
}

// touch creates one child of a vector, so that it is gathered.
func touch(c prometheus.Collector) error {
	values := make([]string, labelCount(c))
	for i := range values {
		values[i] = "x"
	}
	switch v := c.(type) {
	case *metrics.CounterVec:
		v.WithLabelValues(values...)
	case *metrics.GaugeVec:
		v.WithLabelValues(values...)
	case *metrics.HistogramVec:
		v.WithLabelValues(values...)
	case *prometheus.CounterVec:
		v.WithLabelValues(values...)
	case *metrics.Gauge, *metrics.Counter:
	default:
		return fmt.Errorf("collector %T: teach touch to create its child", c)
	}
	return nil
}

// proxyRegistry builds what one configuration registers in the proxy's own
// registry, as proxyServer.observe and serve do, and gathers it.
func proxyRegistry(mode string, localhostNodePorts bool) ([]*dto.MetricFamily, error) {
	rec := &recordingRegistry{KubeRegistry: metrics.NewKubeRegistry()}
	m := serve.NewModeMetricsIn(mode, rec)
	newUpstreamCleanup(mode == modeIPVS, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	conntrack.NewMetrics(m.Registry)
	conntrack.NewPressureMetrics(m.Registry).Set(conntrack.Fill{}) // served once read
	if localhostNodePorts {
		localnodeport.NewMetrics(m.Registry)
	}
	for _, c := range rec.collectors {
		if err := touch(c); err != nil {
			return nil, err
		}
	}
	return rec.Gather()
}

// referenceFamilies is every family /metrics serves, by name: the proxy
// registry of each mode (and nftables mode with localhost NodePorts) and
// the process-wide one, less metricGroups.
func referenceFamilies() ([]familyDoc, error) {
	configs := []struct {
		name, mode string
		localhost  bool
	}{
		{modeIPTables, modeIPTables, false},
		{modeNFTables, modeNFTables, false},
		{modeIPVS, modeIPVS, false},
		{localhostConfig, modeNFTables, true},
	}
	byName := map[string]*familyDoc{}
	add := func(fams []*dto.MetricFamily, served string) {
		for _, f := range fams {
			if slices.ContainsFunc(metricGroups, func(p string) bool { return strings.HasPrefix(f.GetName(), p) }) {
				continue
			}
			d, ok := byName[f.GetName()]
			if !ok {
				d = familyFromDTO(f)
				byName[f.GetName()] = d
			}
			d.served = append(d.served, served)
		}
	}
	for _, c := range configs {
		fams, err := proxyRegistry(c.mode, c.localhost)
		if err != nil {
			return nil, err
		}
		add(fams, c.name)
	}
	processMetrics()
	recordFeatureGates(context.Background(), nil)
	fams, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	add(fams, "process")
	var out []familyDoc
	for _, d := range byName {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// familyFromDTO reads a gathered family's type, labels and help (the
// stability level is component-base's help prefix).
func familyFromDTO(f *dto.MetricFamily) *familyDoc {
	d := &familyDoc{name: f.GetName(), kind: strings.ToLower(f.GetType().String()), help: f.GetHelp(), stability: "-"}
	for _, lvl := range []string{"ALPHA", "BETA", "STABLE", "INTERNAL"} {
		if rest, ok := strings.CutPrefix(d.help, "["+lvl+"] "); ok {
			d.stability, d.help = lvl, rest
		}
	}
	if len(f.GetMetric()) > 0 {
		for _, l := range f.GetMetric()[0].GetLabel() {
			d.labels = append(d.labels, l.GetName())
		}
	}
	return d
}

// servedText names where a family is served: every mode, or the
// configurations that register it.
func servedText(served []string) string {
	if slices.Contains(served, "process") ||
		(slices.Contains(served, modeIPTables) && slices.Contains(served, modeNFTables) && slices.Contains(served, modeIPVS)) {
		return "every mode"
	}
	if slices.Contains(served, modeNFTables) {
		served = slices.DeleteFunc(slices.Clone(served), func(s string) bool { return s == localhostConfig })
	}
	return strings.Join(served, ", ")
}

// metricsTable is the generated table of docs/metrics.md.
func metricsTable(fams []familyDoc) string {
	var b strings.Builder
	b.WriteString("| Family | Type | Labels | Stability | Served in | Meaning (its help text) |\n|---|---|---|---|---|---|\n")
	for _, f := range fams {
		labels := "-"
		if len(f.labels) > 0 {
			labels = "`" + strings.Join(f.labels, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", f.name, f.kind, labels, f.stability,
			servedText(f.served), strings.ReplaceAll(f.help, "|", `\|`))
	}
	return b.String()
}

// TestMetricsReference fails when docs/metrics.md's table is not what the
// registry holds: a family missing or extra, or its type, labels, help or
// modes different. -update rewrites the table.
func TestMetricsReference(t *testing.T) {
	fams, err := referenceFamilies()
	if err != nil {
		t.Fatal(err)
	}
	want := metricsTable(fams)
	b, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := strings.Index(doc, metricsTableBegin), strings.Index(doc, metricsTableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s: no %q ... %q block", metricsDoc, metricsTableBegin, metricsTableEnd)
	}
	begin += len(metricsTableBegin) + 1
	if updating() {
		if err := os.WriteFile(metricsDoc, []byte(doc[:begin]+want+doc[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got := doc[begin:end]
	for _, line := range lineDiff(strings.Split(want, "\n"), strings.Split(got, "\n")) {
		t.Error(line)
	}
	for _, g := range metricGroups {
		if !strings.Contains(doc, "`"+g+"*`") {
			t.Errorf("%s does not describe the group `%s*`", metricsDoc, g)
		}
	}
	if len(fams) < 30 {
		t.Errorf("only %d families in the reference: the registry was not built", len(fams))
	}
}

// lineDiff names the lines of want that got lacks and the lines of got
// that want lacks.
func lineDiff(want, got []string) []string {
	var out []string
	for _, l := range want {
		if !slices.Contains(got, l) {
			out = append(out, "docs/metrics.md lacks (or describes otherwise): "+l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			out = append(out, "docs/metrics.md has, but the registry does not: "+l)
		}
	}
	return out
}

// notServed are families of kube-proxy that docs/metrics.md names as not
// served.
var notServed = []string{"kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"}

var docMetricName = regexp.MustCompile(`\b(?:kubeproxy|kubenftproxy|kubernetes)_[a-z_]+[a-z]`)

// TestDocsNameServedMetrics fails when the operators' docs or the alert
// rules name a family the proxy does not serve (a misspelt or renamed one).
func TestDocsNameServedMetrics(t *testing.T) {
	fams, err := referenceFamilies()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{metricsDoc, "../../docs/troubleshooting.md", alertRulesFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range docMetricName.FindAllString(string(b), -1) {
			if !servedMetric(name, fams) && !slices.Contains(notServed, name) {
				t.Errorf("%s names %s, which the proxy does not serve", f, name)
			}
		}
	}
}
