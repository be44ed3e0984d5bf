// Command demo shows kube-nftproxy at work in a throw-away sandbox of
// network namespaces (e2e/TOPOLOGY.md): it starts an e2e-agent server in
// each pod, runs the proxy in the node namespace on the example state,
// sends TCP and UDP requests to a ClusterIP, a NodePort and an IPv6
// ClusterIP, prints who answered and which source address the backends saw
// (and, when asked, the node's nft ruleset), then stops the proxy and
// deletes the sandbox (also on Ctrl-C and on error).
//
//	go build -o bin/ ./cmd/kube-nftproxy ./e2e/agent ./e2e/demo
//	sudo bin/demo --proxy bin/kube-nftproxy --agent bin/e2e-agent --state examples/demo
//
// It needs root. It exits 1 if a request failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.Proxy, "proxy", "bin/kube-nftproxy", "kube-nftproxy binary")
	flag.StringVar(&cfg.Agent, "agent", "bin/e2e-agent", "e2e-agent binary")
	flag.StringVar(&cfg.State, "state", "examples/demo", "directory of Service/EndpointSlice/Node YAML for the proxy's --state")
	flag.StringVar(&cfg.ProxyLog, "proxy-log", "", "file for the proxy's output (default: a file in $TMPDIR, removed unless the demo fails)")
	flag.DurationVar(&cfg.Wait, "wait", 30*time.Second, "how long to wait for the proxy to make the Service answer")
	flag.BoolVar(&cfg.Verbose, "v", false, "also show the sandbox's progress and every request")
	flag.BoolVar(&cfg.Ruleset, "ruleset", false, "also print the node's nft ruleset")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: demo [flags]   (as root)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}

	// The first signal cancels ctx; the cleanup that follows runs on its
	// own bounded contexts, and further signals are ignored until it is
	// done. SIGPIPE too (`bin/demo | head`): without Notify it would kill
	// the demo before it deletes the sandbox.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	cfg.Out, cfg.Err = os.Stdout, os.Stderr
	if err := run(ctx, cfg); err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "demo: interrupted")
		} else {
			fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		}
		stop()
		os.Exit(1)
	}
}

type config struct {
	Proxy, Agent, State string
	ProxyLog            string
	Wait                time.Duration
	Verbose, Ruleset    bool
	Out, Err            io.Writer
}
