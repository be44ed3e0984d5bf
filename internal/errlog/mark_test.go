package errlog

import (
	"slices"
	"testing"
)

// A Mark rises once at the high mark, stays raised between the marks, and
// falls once under the low one.
func TestMark(t *testing.T) {
	// Levels against a high mark of 90 and a low one of 80.
	tests := []struct {
		name   string
		levels []int
		want   []string // "rose" or "fell", in order
	}{
		{"under the high mark", []int{10, 89, 85}, nil},
		{"at the high mark: once", []int{90, 99, 120}, []string{"rose"}},
		{"between the marks: no flapping", []int{95, 85, 91, 80}, []string{"rose"}},
		{"under the low mark, and again", []int{95, 79, 70, 92}, []string{"rose", "fell", "rose"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m Mark
			var got []string
			for _, l := range tc.levels {
				rose, fell := m.Update(l >= 90, l < 80)
				if rose {
					got = append(got, "rose")
				}
				if fell {
					got = append(got, "fell")
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("levels %v: %v, want %v", tc.levels, got, tc.want)
			}
		})
	}
}
