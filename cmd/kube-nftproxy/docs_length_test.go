package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The README is for users and the docs say each thing once; these bounds
// keep them so. Words are counted as wc -w counts them.
const (
	// readmeMaxWords is the most README.md may hold.
	readmeMaxWords = 2500
	// docsWordsBelow is what docs/*.md together must stay under.
	docsWordsBelow = 28000
)

// wordCount is the number of whitespace-separated fields of text, as wc -w.
func wordCount(text string) int {
	return len(strings.Fields(text))
}

func TestWordCount(t *testing.T) {
	tests := []struct {
		name, text string
		want       int
	}{
		{"empty", "", 0},
		{"spaces only", " \t\n ", 0},
		{"one line", "make demo   # builds", 4},
		{"lines and tabs", "| a | b |\n\tc\r\nd", 7},
		{"punctuation joins a field", "ns/name:port -> 10.0.0.1:80", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := wordCount(tt.text); got != tt.want {
				t.Errorf("wordCount(%q) = %d, want %d", tt.text, got, tt.want)
			}
		})
	}
}

// fileWords is the word count of each file, in order.
func fileWords(t *testing.T, files []string) []int {
	t.Helper()
	counts := make([]int, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		counts[i] = wordCount(string(b))
	}
	return counts
}

// TestDocsWordCounts fails when README.md passes readmeMaxWords or the docs
// together reach docsWordsBelow, naming each doc's count.
func TestDocsWordCounts(t *testing.T) {
	readme := fileWords(t, []string{"../../README.md"})[0]
	if readme > readmeMaxWords {
		t.Errorf("README.md has %d words, more than %d: the README says what the proxy is and how to run it and links to docs/ for the rest; tables and figures belong in the doc that holds them (benchmarks in docs/benchmarks.md, flags in docs/configuration.md)", readme, readmeMaxWords)
	}

	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("found no docs/*.md")
	}
	counts := fileWords(t, docs)
	total := 0
	var each []string
	for i, n := range counts {
		total += n
		each = append(each, fmt.Sprintf("%s %d", strings.TrimPrefix(docs[i], "../../"), n))
	}
	if total >= docsWordsBelow {
		t.Errorf("docs/*.md have %d words together, want fewer than %d (%s): say each thing once, in one doc, and link to it; each figure belongs in one place (benchmarks in docs/benchmarks.md, fault figures in docs/reliability.md), and the story of earlier runs in git", total, docsWordsBelow, strings.Join(each, ", "))
	}
}
