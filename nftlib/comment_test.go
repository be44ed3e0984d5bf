package nftlib

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A comment is clamped to what nft keeps: at most MaxComment bytes of valid
// UTF-8, without quotes or backslashes, and clamping twice changes nothing.
func TestClampComment(t *testing.T) {
	for _, c := range []string{"", "plain", strings.Repeat("a", 200), strings.Repeat("é", 100), strings.Repeat("服", 60),
		"a\"b\\c\x00d\xffe", "\u200b zero width"} {
		got := clampComment(c)
		if len(got) > MaxComment || !utf8.ValidString(got) || strings.ContainsAny(got, "\"\\") {
			t.Errorf("clampComment(%q) = %q: %d bytes, valid UTF-8 %v", c, got, len(got), utf8.ValidString(got))
		}
		if clampComment(got) != got {
			t.Errorf("clampComment is not idempotent on %q", c)
		}
	}
}
