package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// writeRegistry lays out one image of a docker archive as agnhost's
// fake-registry-server serves it (its Dockerfile fills /var/registry with
// registry.k8s.io/pause:3.10.2 tagged "testing", downloaded at build time;
// here the pause image built locally takes its place):
//
//	DIR/NAME/manifests/TAG                          the index's digest
//	DIR/NAME/manifests/sha256/ab/abcd.../data       the index and the image manifest
//	DIR/NAME/blobs/sha256/ab/abcd.../data           the config and the layers
//
// The tag points at an index with one linux image, as the real registry's
// manifest list does once its Windows entries are filtered out.
func writeRegistry(archive, dir, name, tag, platform string) error {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("read %s: %w", archive, err)
	}
	if img, err = servedCopy(img, name+":"+tag); err != nil {
		return fmt.Errorf("%s: %w", archive, err)
	}
	plat, err := v1.ParsePlatform(platform)
	if err != nil {
		return fmt.Errorf("platform %q: %w", platform, err)
	}
	// The archive's manifest is Docker's schema 2, so the index is Docker's
	// manifest list, as a registry serving such images would give.
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: img, Descriptor: v1.Descriptor{Platform: plat},
	}), types.DockerManifestList)
	root := filepath.Join(dir, name)
	idxDigest, err := writeManifest(root, idx)
	if err != nil {
		return err
	}
	if _, err := writeManifest(root, img); err != nil {
		return err
	}
	if err := writeBlobs(root, img); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "manifests", tag), []byte(idxDigest.String()+"\n"), 0o644)
}

// servedCopy is img with a label naming it served (ref), so that its ID
// differs from the image the nodes hold preloaded. Kubelet records, per
// image ID, the pull secrets of the pulls it made; once the
// LocalhostNodePorts spec has pulled pause:testing with its secret, a pod
// of registry.k8s.io/pause with the same ID and no secret would have to
// pull again to prove its access, which fails without a registry (as the
// nodes of a real cluster, which pulled the pause image themselves, do
// not).
func servedCopy(img v1.Image, ref string) (v1.Image, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	if cfg.Config.Labels == nil {
		cfg.Config.Labels = map[string]string{}
	}
	cfg.Config.Labels["io.kube-nftproxy.served-as"] = ref
	return mutate.ConfigFile(img, cfg)
}

// rawManifester is an image or an index: what has a manifest and a digest.
type rawManifester interface {
	RawManifest() ([]byte, error)
	Digest() (v1.Hash, error)
}

func writeManifest(root string, m rawManifester) (v1.Hash, error) {
	raw, err := m.RawManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	d, err := m.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	return d, writeDigestFile(filepath.Join(root, "manifests"), d, strings.NewReader(string(raw)))
}

func writeBlobs(root string, img v1.Image) error {
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	if err := writeDigestFile(filepath.Join(root, "blobs"), cfgName, strings.NewReader(string(cfg))); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = writeDigestFile(filepath.Join(root, "blobs"), d, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// writeDigestFile writes r to BASE/ALGO/AB/HEX/data, the registry storage
// layout the fake registry reads.
func writeDigestFile(base string, d v1.Hash, r io.Reader) error {
	p := filepath.Join(base, d.Algorithm, d.Hex[:2], d.Hex, "data")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	return f.Close()
}
