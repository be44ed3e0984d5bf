// Command cluster brings up, checks and removes the two-node Kubernetes
// cluster of package e2e/cluster:
//
//	go run ./e2e/cluster/cmd up      # from nothing to a smoke-checked cluster
//	go run ./e2e/cluster/cmd smoke   # the smoke check again
//	go run ./e2e/cluster/cmd status  # nodes and pods
//	go run ./e2e/cluster/cmd down    # remove everything, check nothing is left
//	go run ./e2e/cluster/cmd kubectl get pods -A
//	go run ./e2e/cluster/cmd junit bin/conformance/ours/junit_01.xml
//	cluster guest-node node1          # in a node's UML guest (hack/vm/cluster.sh)
//
// Run it as root from the repository root (up applies deploy/).
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/cluster"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cluster up|smoke|status|down|kubectl ARGS...|junit FILES...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l := cluster.DefaultLayout()
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(ctx, l, logf, start)
	case "smoke":
		err = smoke(ctx, l, logf)
	case "down":
		err = l.Down(ctx, logf)
		if err == nil {
			logf("cluster removed; nothing left")
		}
	case "status":
		err = kubectl(ctx, l, "get", "nodes,pods", "-A", "-o", "wide")
	case "kubectl":
		err = kubectl(ctx, l, os.Args[2:]...)
	case "junit":
		err = junit(os.Args[2:]...)
	case "guest-node":
		if len(os.Args) != 3 {
			err = fmt.Errorf("usage: cluster guest-node NAME")
			break
		}
		err = l.RunGuestNode(ctx, os.Args[2], logf)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func up(ctx context.Context, l cluster.Layout, logf func(string, ...any), start time.Time) error {
	if err := l.Up(ctx, "deploy", logf); err != nil {
		return fmt.Errorf("%w\n(logs in %s/logs; `make cluster-down` removes it)", err, l.Dir)
	}
	if err := smoke(ctx, l, logf); err != nil {
		return err
	}
	logf("cluster up and smoke-checked in %v; kubeconfig %s (API server inside netns %s: hack/cluster/kubectl.sh)",
		time.Since(start).Round(100*time.Millisecond), l.Kubeconfig(), l.NodeNet)
	return nil
}

func smoke(ctx context.Context, l cluster.Layout, logf func(string, ...any)) error {
	res, err := l.Smoke(ctx)
	if res == nil {
		return err
	}
	logf("smoke: pod on %s -> web.knp-smoke.svc.cluster.local answered by %v", l.Nodes[0].Name, res.ViaDNS)
	if res.ViaDNSIPv6 != nil {
		logf("smoke: pod on %s -> web6.knp-smoke.svc.cluster.local (IPv6 alone) answered by %v", l.Nodes[0].Name, res.ViaDNSIPv6)
	}
	for _, np := range res.NodePorts {
		logf("smoke: NodePort %s from the node network answered by %v, backends saw sources %v (masqueraded)",
			net.JoinHostPort(np.Addr, "30080"), np.Backends, np.Sources)
	}
	if err != nil {
		return err
	}
	lbs, err := l.SmokeLoadBalancer(ctx)
	for _, lb := range lbs {
		logf("smoke: load balancer %s (externalTrafficPolicy Local) from the node network answered by %v, which saw %v",
			net.JoinHostPort(lb.Addr, "80"), lb.Backends, lb.Sources)
	}
	return err
}

// kubectl runs kubectl as admin inside the node network namespace, where
// the API server listens.
func kubectl(ctx context.Context, l cluster.Layout, args ...string) error {
	argv := append([]string{"--net=" + cluster.NetNSPath(l.NodeNet), "--", l.KubectlBin(), "--kubeconfig=" + l.Kubeconfig()}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = os.Stdout, os.Stderr, os.Stdin
	return cmd.Run()
}

// junit prints the counts of e2e.test's JUnit reports, and fails when a
// spec failed.
func junit(paths ...string) error {
	s, err := cluster.ReadJUnit(paths...)
	if err != nil {
		return err
	}
	fmt.Print(s)
	if s.Failed > 0 {
		return fmt.Errorf("%d failed", s.Failed)
	}
	return nil
}
