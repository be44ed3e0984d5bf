package cluster

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// JUnitCase is one spec of a ginkgo JUnit report.
type JUnitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
}

// JUnitSummary counts the specs a run selected: those ginkgo filtered out
// by focus/skip are not counted; Skipped are specs that skipped themselves
// (their reasons in SkipReasons, by count).
type JUnitSummary struct {
	Ran, Passed, Failed, Skipped int
	Failures                     []string
	SkipReasons                  map[string]int
}

// ReadJUnit parses ginkgo JUnit reports and sums them.
func ReadJUnit(paths ...string) (JUnitSummary, error) {
	s := JUnitSummary{SkipReasons: map[string]int{}}
	if len(paths) == 0 {
		return s, fmt.Errorf("no JUnit report")
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return s, err
		}
		err = s.add(f)
		f.Close()
		if err != nil {
			return s, fmt.Errorf("%s: %w", p, err)
		}
	}
	sort.Strings(s.Failures)
	return s, nil
}

func (s *JUnitSummary) add(r io.Reader) error {
	var doc struct {
		Suites []struct {
			Cases []JUnitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return err
	}
	for _, suite := range doc.Suites {
		for _, c := range suite.Cases {
			s.count(c)
		}
	}
	return nil
}

func (s *JUnitSummary) count(c JUnitCase) {
	if !strings.HasPrefix(c.Name, "[It] ") {
		if c.Status != "passed" && c.Status != "skipped" {
			s.Failed++ // a failed BeforeSuite or AfterSuite fails the run
			s.Failures = append(s.Failures, c.Name)
		}
		return
	}
	name := strings.TrimPrefix(c.Name, "[It] ")
	switch c.Status {
	case "passed":
		s.Ran++
		s.Passed++
	case "skipped":
		reason := ""
		if c.Skipped != nil {
			reason = c.Skipped.Message
		}
		if reason == "" || reason == "skipped" {
			return // filtered out by focus/skip: not part of the selection
		}
		s.Skipped++
		s.SkipReasons[firstLine(reason)]++
	case "pending":
	default:
		s.Ran++
		s.Failed++
		s.Failures = append(s.Failures, name)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "skipped -"))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// String is the summary as the conformance script prints it.
func (s JUnitSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ran %d, passed %d, failed %d, skipped %d\n", s.Ran, s.Passed, s.Failed, s.Skipped)
	for _, f := range s.Failures {
		fmt.Fprintf(&b, "  FAILED  %s\n", f)
	}
	reasons := make([]string, 0, len(s.SkipReasons))
	for r := range s.SkipReasons {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(&b, "  skipped %d: %s\n", s.SkipReasons[r], r)
	}
	return b.String()
}
