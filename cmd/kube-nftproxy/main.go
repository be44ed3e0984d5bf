// Command kube-nftproxy is a Kubernetes service proxy that programs nftables
// over netlink, a drop-in for kube-proxy.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kube-nftproxy:", err)
		os.Exit(1)
	}
}
