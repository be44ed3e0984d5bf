package nft

import (
	"os"
	"testing"
)

// TestWriteScaleRender writes the rendered ruleset of a scale state to the
// file named by KNP_RENDER_OUT, to time `nft -f` on the same objects.
func TestWriteScaleRender(t *testing.T) {
	out := os.Getenv("KNP_RENDER_OUT")
	if out == "" {
		t.Skip("set KNP_RENDER_OUT=FILE to write the 5k-service render")
	}
	if err := os.WriteFile(out, []byte(Build(scaleState(5000, 10), demoConfig()).String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
