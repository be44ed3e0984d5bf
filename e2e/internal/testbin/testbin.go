// Package testbin builds the binaries the kernel tests run inside the
// sandbox.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Module is this repository's module path.
const Module = "github.com/kube-nftproxy/kube-nftproxy"

// AgentEnv names the environment variable that points the tests at a
// prebuilt e2e-agent (make e2e sets it) instead of building one.
const AgentEnv = "E2E_AGENT"

// Build compiles the main package pkg (an import path) into dir and returns
// the binary's absolute path.
func Build(pkg, dir string) (string, error) {
	// go test puts its own go first in PATH.
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build %s: %w (or set $%s to a prebuilt agent)", pkg, err, AgentEnv)
	}
	out, err := filepath.Abs(filepath.Join(dir, path.Base(pkg)))
	if err != nil {
		return "", err
	}
	cmd := exec.Command(gobin, "build", "-o", out, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(string(msg)))
	}
	return out, nil
}

// Agent returns the path of an e2e-agent binary: $E2E_AGENT if set, else
// one freshly built into dir.
func Agent(dir string) (string, error) {
	if p := os.Getenv(AgentEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("$%s: %w", AgentEnv, err)
		}
		return abs, nil
	}
	return Build(Module+"/e2e/agent", dir)
}
