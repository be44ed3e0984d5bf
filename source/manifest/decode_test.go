package manifest

import (
	"reflect"
	"testing"
)

func TestSplitDocuments(t *testing.T) {
	tests := []struct {
		in    string
		lines []int
		docs  []string
	}{
		{"a: 1\n", []int{1}, []string{"a: 1\n"}},
		{"---\na: 1\n---\nb: 2\n", []int{1, 2, 4}, []string{"", "a: 1\n", "b: 2\n"}},
		{"a: 1\n--- # comment\nb: 2\n...\n", []int{1, 3}, []string{"a: 1\n", "b: 2\n"}},
		{"# c\n\na: 1\n---\n\n# c\nb: 2\n", []int{3, 7}, []string{"# c\n\na: 1\n", "\n# c\nb: 2\n"}},
		{"a: 1\n--- {b: 2}\n", []int{1, 2}, []string{"a: 1\n", " {b: 2}\n"}},
		{"a: 1\r\n---\r\nb: 2\r\n", []int{1, 3}, []string{"a: 1\r\n", "b: 2\r\n"}},
		{"a: '---'\nb: |\n  ---x\n", []int{1}, []string{"a: '---'\nb: |\n  ---x\n"}},
		// What the copying split gave, kept by the one that cuts data in place.
		{"", []int{1}, []string{""}},
		{"a: 1", []int{1}, []string{"a: 1"}},
		{"a: 1\n...\nb: 2\n---\nc: 3", []int{1, 5}, []string{"a: 1\nb: 2\n", "c: 3"}},
		{"...\na: 1\n", []int{1}, []string{"a: 1\n"}},
		{"a: 1\n---", []int{1, 3}, []string{"a: 1\n", ""}},
		{"a: 1\n---\n", []int{1, 3}, []string{"a: 1\n", ""}},
		{"---\t# c\nx: 1\n--- \ny: 2\n", []int{1, 2, 4}, []string{"", "x: 1\n", "y: 2\n"}},
		{"a: 1\n--- {b: 2}\n...\n--- x\n", []int{1, 2, 4}, []string{"a: 1\n", " {b: 2}\n", " x\n"}},
		{"\n\n---\n\n", []int{2, 4}, []string{"\n\n", "\n"}},
	}
	for _, tt := range tests {
		docs := splitDocuments([]byte(tt.in))
		var lines []int
		var texts []string
		for _, d := range docs {
			lines = append(lines, d.line)
			texts = append(texts, string(d.data))
		}
		if !reflect.DeepEqual(lines, tt.lines) {
			t.Errorf("lines of %q: got %v, want %v", tt.in, lines, tt.lines)
		}
		if !reflect.DeepEqual(texts, tt.docs) {
			t.Errorf("docs of %q: got %q, want %q", tt.in, texts, tt.docs)
		}
	}
}
