package main

import "testing"

// editDistance counts insertions, deletions and substitutions (TestFlagErrors
// shows the suggestions made with it).
func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"abc", "ab", 1}, {"abc", "abd", 1}, {"ab", "ba", 2}, {"kitten", "sitting", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
