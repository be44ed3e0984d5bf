package main

import (
	"errors"
	"slices"
	"testing"
)

// TestEarlySource checks that what the API source reports before the loop
// exists reaches it, in order, once wired, and later calls pass straight on.
func TestEarlySource(t *testing.T) {
	boom := errors.New("connection refused")
	for _, tc := range []struct {
		name          string
		before, after func(e *earlySource)
		want          []string
	}{
		{"nothing", func(*earlySource) {}, func(*earlySource) {}, nil},
		{"ready before wiring", func(e *earlySource) { e.changed(); e.readyNow(); e.changed() }, func(*earlySource) {},
			[]string{"ready"}},
		{"failures then recovery then ready", func(e *earlySource) { e.failing(boom); e.failing(boom); e.ok(); e.readyNow() }, func(*earlySource) {},
			[]string{"failing connection refused", "failing connection refused", "ok", "ready"}},
		{"still failing", func(e *earlySource) { e.ok(); e.failing(boom) }, func(*earlySource) {},
			[]string{"failing connection refused"}},
		{"after wiring", func(*earlySource) {}, func(e *earlySource) { e.readyNow(); e.changed(); e.failing(boom); e.ok() },
			[]string{"ready", "changed", "failing connection refused", "ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			e := &earlySource{}
			tc.before(e)
			e.wire(sourceCallbacks{
				changed: func() { got = append(got, "changed") },
				ready:   func() { got = append(got, "ready") },
				failing: func(err error) { got = append(got, "failing "+err.Error()) },
				ok:      func() { got = append(got, "ok") },
			})
			tc.after(e)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
