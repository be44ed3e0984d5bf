package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// processPhrases tell the story of builds, runs and fixes rather than the
// product as it stands; git keeps that story, the docs say what is true now.
var processPhrases = []string{
	"previous build",
	"this branch",
	"the day's first build",
	"earlier run",
	"earlier build",
	"before the fix",
	"before it was fixed",
	"until now",
	"as before",
	"the last run of the day",
	"(was:",
	"was: ",
}

// processPhraseHits is each line of text holding one of phrases
// (case-insensitive), as "name:line: phrase".
func processPhraseHits(name, text string, phrases []string) []string {
	var hits []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.ToLower(sc.Text())
		for _, p := range phrases {
			if strings.Contains(line, p) {
				hits = append(hits, fmt.Sprintf("%s:%d: %q", name, n, p))
			}
		}
	}
	return hits
}

func TestProcessPhraseHits(t *testing.T) {
	tests := []struct {
		name, text string
		want       []string
	}{
		{"none", "A sync costs what changed.\nIt was fast.", nil},
		{"case and line", "ok\nMeasured against the Previous Build.\n", []string{`d.md:2: "previous build"`}},
		{"two on a line", "until now, as before", []string{`d.md:1: "until now"`, `d.md:1: "as before"`}},
		{"was colon", "46 MiB (was: 2.24 GiB)", []string{`d.md:1: "(was:"`, `d.md:1: "was: "`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := processPhraseHits("d.md", tt.text, processPhrases)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestDocsSayNoProcessWords fails naming file:line for each phrase of
// processPhrases in README.md and docs/*.md.
func TestDocsSayNoProcessWords(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{"../../README.md"}, docs...)
	if len(files) < 2 {
		t.Fatalf("found no docs beside the README: %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		for _, hit := range processPhraseHits(name, string(b), processPhrases) {
			t.Errorf("%s: docs say what stands; the story of builds and runs belongs in git", hit)
		}
	}
}
