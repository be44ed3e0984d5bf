package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	apimachineryversion "k8s.io/apimachinery/pkg/version"

	"github.com/spf13/cobra"
)

// release and commit are stamped at build time (make build, the image):
//
//	-ldflags "-X main.release=$(git describe --tags --always --dirty) -X main.commit=$(git rev-parse HEAD)"
//
// Without them, the Go toolchain's own VCS stamp is used.
var (
	release string
	commit  string
)

// buildVersion is what this binary was built from: the stamped release
// and commit, else the module version and vcs.revision the go command
// records (a plain `go build` in a checkout), else "devel" and "unknown".
func buildVersion() (rel, com string) {
	return versionFrom(release, commit, debug.ReadBuildInfo)
}

func versionFrom(rel, com string, readBuildInfo func() (*debug.BuildInfo, bool)) (string, string) {
	if bi, ok := readBuildInfo(); ok && (rel == "" || com == "") {
		var revision string
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if com == "" && revision != "" {
			com = revision
			if modified {
				com += "-dirty"
			}
		}
		if v := bi.Main.Version; rel == "" && v != "" && v != "(devel)" {
			rel = v
		}
	}
	if rel == "" {
		rel = "devel"
	}
	if com == "" {
		com = "unknown"
	}
	return rel, com
}

// versionLine is "kube-nftproxy <release> (<commit>)".
func versionLine() string {
	rel, com := buildVersion()
	return fmt.Sprintf("kube-nftproxy %s (%s)", rel, com)
}

// buildInfo is this build as component-base's version.Info: major and
// minor are the kube-proxy release we follow (emulatedMajor/Minor), the
// git fields ours. kubernetes_build_info and --version=raw show it.
func buildInfo() apimachineryversion.Info {
	rel, com := buildVersion()
	tree := "clean"
	if strings.HasSuffix(com, "-dirty") {
		tree = "dirty"
	}
	return apimachineryversion.Info{
		Major:        fmt.Sprint(emulatedMajor),
		Minor:        fmt.Sprint(emulatedMinor),
		GitVersion:   rel,
		GitCommit:    strings.TrimSuffix(com, "-dirty"),
		GitTreeState: tree,
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the release and commit this binary was built from",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
		},
	}
}

// addVersionFlag gives cmd kube-proxy's --version: given alone (or =true)
// it prints "kube-nftproxy <version>" (kube-proxy: "Kubernetes <version>")
// and exits, =raw prints the whole version.Info as kube-proxy does, =false
// runs as usual. It is handled before anything else, as
// kube-proxy's is, so that it works with any other flags.
func addVersionFlag(cmd *cobra.Command) {
	var v string
	fs := cmd.Flags()
	fs.StringVar(&v, "version", "false", "print the version (--version or --version=raw) and exit; --version=vX.Y.Z sets the version reported")
	fs.Lookup("version").NoOptDefVal = "true"
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		done, err := printVersionFlag(c.OutOrStdout(), v)
		if done || err != nil {
			return err
		}
		return run(c, args)
	}
}

// setReportedVersion is --version=vX.Y.Z: as component-base's, it sets the
// version the binary reports (--version, the version command) and runs on;
// the version must keep this build's major, minor and patch when the build
// has a release version.
func setReportedVersion(v string) error {
	want, err := utilversion.ParseSemantic(v)
	if err != nil {
		return fmt.Errorf("--version %q: %w", v, err)
	}
	rel, _ := buildVersion()
	if have, err := utilversion.ParseSemantic(rel); err == nil &&
		(have.Major() != want.Major() || have.Minor() != want.Minor() || have.Patch() != want.Patch()) {
		return fmt.Errorf("--version: version %q must match major/minor/patch of default version %q", v, rel)
	}
	release = v
	return nil
}

// printVersionFlag prints what --version=v asks for; done says the command
// should stop there.
func printVersionFlag(w io.Writer, v string) (done bool, err error) {
	switch v {
	case "false":
		return false, nil
	case "true":
		fmt.Fprintf(w, "kube-nftproxy %s\n", buildInfo())
	case "raw":
		fmt.Fprintf(w, "%#v\n", buildInfo())
	default:
		if strings.HasPrefix(v, "v") {
			return false, setReportedVersion(v)
		}
		return true, fmt.Errorf("--version %q: want true, false, raw or vX.Y.Z", v)
	}
	return true, nil
}
