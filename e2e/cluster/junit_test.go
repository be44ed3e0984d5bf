package cluster

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestReadJUnit counts a ginkgo report as e2e.test writes it: specs
// filtered out by focus/skip ("skipped" with no reason) are not part of the
// run; self-skipped specs keep their reason; a failed suite node counts.
func TestReadJUnit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cases string
		want  JUnitSummary
	}{
		{
			name: "mixed",
			cases: `<testcase name="[It] [sig-network] Services a" status="passed" time="1"></testcase>
<testcase name="[It] [sig-network] Services b" status="failed" time="2"><failure type="failed">boom</failure></testcase>
<testcase name="[It] [sig-network] Services c" status="skipped" time="0"><skipped message="skipped - Only supported for providers [gce]&#xA;more"></skipped></testcase>
<testcase name="[It] [sig-storage] d" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] [sig-network] Services e" status="timedout" time="9"><failure type="timedout"></failure></testcase>
<testcase name="[SynchronizedBeforeSuite]" status="passed" time="1"></testcase>`,
			want: JUnitSummary{Ran: 3, Passed: 1, Failed: 2, Skipped: 1,
				Failures:    []string{"[sig-network] Services b", "[sig-network] Services e"},
				SkipReasons: map[string]int{"Only supported for providers [gce]": 1}},
		},
		{
			name:  "failed BeforeSuite",
			cases: `<testcase name="[SynchronizedBeforeSuite]" status="failed" time="1"><failure type="failed">x</failure></testcase>`,
			want:  JUnitSummary{Failed: 1, Failures: []string{"[SynchronizedBeforeSuite]"}, SkipReasons: map[string]int{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "junit_01.xml")
			doc := `<?xml version="1.0" encoding="UTF-8"?><testsuites><testsuite name="Kubernetes e2e suite">` + tc.cases + `</testsuite></testsuites>`
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ReadJUnit(path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if _, err := ReadJUnit(); err == nil {
		t.Error("no report: want an error")
	}
}
