package cluster

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestContainerdPerNode starts each node's containerd (the contract's, or
// Debian's) in the node's namespace with the generated configuration,
// checks that its CRI plugin loaded, then runs Down and checks that
// nothing is left.
func TestContainerdPerNode(t *testing.T) {
	l := rootLayout(t)
	if !executable(l.containerdBin()) {
		t.Skipf("no containerd at %s (apt-get install containerd runc)", l.containerdBin())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { _ = l.Down(context.Background(), t.Logf) })
	if err := l.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	forgetGlobalPaths(t, l)
	for _, n := range l.Nodes {
		d, err := l.startDaemon("containerd-"+n.Name, n.Name,
			[]string{l.containerdBin(), "--config", l.nodeFile(n, "containerd.toml")})
		if err != nil {
			t.Fatal(err)
		}
		var plugins string
		err = poll(ctx, time.Minute, func() (bool, error) {
			if d.exited() {
				b, _ := os.ReadFile(l.logFile("containerd-" + n.Name))
				t.Fatalf("containerd of %s exited:\n%s", n.Name, b)
			}
			plugins, err = output(ctx, l.ctrBin(), "--address", l.ContainerdSocket(n), "plugins", "ls")
			return err == nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		criOK := false
		for _, line := range strings.Split(plugins, "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && strings.HasPrefix(f[0], "io.containerd.") && (f[1] == "cri" || f[0] == "io.containerd.cri.v1") {
				criOK = f[len(f)-1] == "ok"
			}
		}
		if !criOK {
			b, _ := os.ReadFile(l.logFile("containerd-" + n.Name))
			t.Errorf("%s: CRI plugin not ok:\n%s\n%s", n.Name, plugins, b)
		}
	}
	if err := l.Down(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
}
