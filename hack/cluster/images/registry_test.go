package main

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
)

// TestServedCopyHasItsOwnID: the registry's pause:testing must not share
// its image ID with the nodes' preloaded pause image (see servedCopy),
// while its layers stay the same.
func TestServedCopyHasItsOwnID(t *testing.T) {
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	served, err := servedCopy(img, "pause:testing")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := img.ConfigName()
	servedID, _ := served.ConfigName()
	if id == servedID {
		t.Errorf("the served copy has the image's ID %s", id)
	}
	layers, _ := img.Layers()
	servedLayers, _ := served.Layers()
	if len(layers) != 1 || len(servedLayers) != 1 {
		t.Fatalf("layers: %d and %d, want 1 each", len(layers), len(servedLayers))
	}
	a, _ := layers[0].Digest()
	b, _ := servedLayers[0].Digest()
	if a != b {
		t.Errorf("the served copy's layer is %s, the image's %s", b, a)
	}
	cfg, err := served.ConfigFile()
	if err != nil || cfg.Config.Labels["io.kube-nftproxy.served-as"] != "pause:testing" {
		t.Errorf("served copy's labels %v (%v)", cfg.Config.Labels, err)
	}
}
