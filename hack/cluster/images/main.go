// Command cluster-images assembles container images as docker archives or
// OCI image layout archives without a registry or a container engine:
// prebuilt layer tarballs plus one layer generated from host files, and an
// image config, written with go-containerregistry. hack/cluster/images.sh
// drives it, one image per call; the nodes import the archives with
// `ctr -n k8s.io images import`. hack/image.sh (make image) writes
// kube-nftproxy's multi-platform OCI archive with it:
//
//	cluster-images build -format oci -out kube-nftproxy.tar -ref kube-nftproxy:v0.1.0 \
//	    -platform linux/amd64 -platform linux/arm64 -epoch "$SOURCE_DATE_EPOCH" \
//	    -file '/kube-nftproxy=bin/{os}-{arch}/kube-nftproxy' -entrypoint '["/kube-nftproxy"]'
//	cluster-images tag -in kube-nftproxy.tar -out cluster.tar -ref registry.local/kube-nftproxy:dev
//
//	cluster-images build -out pause.tar -ref registry.k8s.io/pause:3.10.2 \
//	    -file /pause=/tmp/pause -user 65535:65535 -entrypoint '["/pause"]'
//	cluster-images layer -out coredns.tar.gz -file /coredns=bin/coredns
//	cluster-images inspect pause.tar
//	cluster-images registry -archive pause.tar -out DIR -name pause -tag testing
//
// layer writes one layer tarball that several images share (-layer): the
// same inputs always give the same bytes, so the same digest. Both skip
// the work when the archive's stamp (a hash of the flags and of
// every input file) is unchanged.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "cluster-images:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: cluster-images build|layer|tag|digest|inspect|registry ... (build -h for flags)")
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:], stdout, stderr)
	case "layer":
		return runLayer(args[1:], stdout, stderr)
	case "registry":
		return runRegistry(args[1:], stdout, stderr)
	case "tag":
		return runTag(args[1:], stdout, stderr)
	case "digest":
		if len(args) != 2 {
			return fmt.Errorf("usage: cluster-images digest OCI-ARCHIVE")
		}
		d, err := archiveIndexDigest(args[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, d)
		return nil
	case "inspect":
		if len(args) != 2 {
			return fmt.Errorf("usage: cluster-images inspect ARCHIVE")
		}
		return inspect(args[1], stdout)
	}
	return fmt.Errorf("unknown command %q (want build, layer, tag, digest, inspect or registry)", args[0])
}

func runBuild(args []string, stdout, stderr io.Writer) error {
	spec, err := parseSpec(args, false, stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := build(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", spec.Refs[0], err)
	}
	digest := res.Digest
	if spec.Format == formatDocker && digest != "" {
		digest = digest[:19] // an image ID, as docker shows it
	}
	if res.Cached {
		fmt.Fprintf(stdout, "cached  %s (%s%s)\n", spec.Refs[0], spec.Out, prefixed(", ", digest))
		return nil
	}
	fmt.Fprintf(stdout, "built   %s (%s, %s) in %.1fs\n", spec.Refs[0], spec.Out, digest,
		time.Since(start).Seconds())
	return nil
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

func runLayer(args []string, stdout, stderr io.Writer) error {
	spec, err := parseSpec(args, true, stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	cached, err := buildLayer(spec)
	if err != nil {
		return err
	}
	if cached {
		fmt.Fprintf(stdout, "cached  layer %s\n", spec.Out)
		return nil
	}
	fmt.Fprintf(stdout, "built   layer %s in %.1fs\n", spec.Out, time.Since(start).Seconds())
	return nil
}

// runRegistry writes the fake registry layout of one archived image.
func runRegistry(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("registry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	archive := fs.String("archive", "", "docker archive holding the image (required)")
	out := fs.String("out", "", "directory to fill, the image's /var/registry (required)")
	name := fs.String("name", "", "repository name served, e.g. pause (required)")
	tag := fs.String("tag", "latest", "tag served")
	platform := fs.String("platform", "linux/amd64", "the image's os/arch in the index")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *archive == "" || *out == "" || *name == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: cluster-images registry -archive A -out DIR -name NAME [-tag T]")
	}
	if err := os.RemoveAll(filepath.Join(*out, *name)); err != nil {
		return err
	}
	if err := writeRegistry(*archive, *out, *name, *tag, *platform); err != nil {
		return fmt.Errorf("registry %s:%s: %w", *name, *tag, err)
	}
	fmt.Fprintf(stdout, "wrote   registry %s/%s:%s\n", *out, *name, *tag)
	return nil
}

// runTag copies an OCI layout archive under other references.
func runTag(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tag", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "OCI layout archive to copy (required)")
	out := fs.String("out", "", "archive to write (required)")
	var refs listFlag
	fs.Var(&refs, "ref", "image reference (repeatable, at least one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || len(refs) == 0 || fs.NArg() > 0 {
		return fmt.Errorf("usage: cluster-images tag -in A -out B -ref REF [-ref REF]")
	}
	if err := retag(*in, *out, refs); err != nil {
		return err
	}
	digest, err := archiveIndexDigest(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tagged  %s (%s, %s)\n", refs[0], *out, digest)
	return nil
}

// inspect prints an archive's tags, layers and config, as a debugging aid.
func inspect(archive string, stdout io.Writer) error {
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(archive) })
	if err != nil {
		return fmt.Errorf("read %s: %w", archive, err)
	}
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("read %s: %w", archive, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var tags []string
	for _, d := range manifest {
		tags = append(tags, d.RepoTags...)
	}
	out := struct {
		RepoTags []string
		Layers   int
		OS, Arch string
		Config   any
	}{tags, len(layers), cf.OS, cf.Architecture, cf.Config}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
