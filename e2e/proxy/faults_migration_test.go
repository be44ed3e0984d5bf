package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestUpstreamRulesStayUntilOurFirstSync: a node moving from upstream
// kube-proxy (iptables mode, stopped, its rules left) to us must never be
// without Service rules. Our start-up used to remove kube-proxy's chains
// at once, before our first sync, which waits for the API server's first
// complete listing: on a real cluster every migrated node dropped Service
// traffic for about 125 ms (issue 19, e2e/cluster TestClusterFaultMigration),
// and for as long as the API server was unreachable. Here the API server is
// stopped while we start: kube-proxy's rules must stay until our first
// sync, then go.
func TestUpstreamRulesStayUntilOurFirstSync(t *testing.T) {
	t.Parallel()
	u := newUpstreamEnv(t)
	kp := u.runKubeProxy(t, "iptables", "jump KUBE-SVC-")
	if err := kp.Stop(10 * time.Second); err != nil {
		t.Logf("kube-proxy on SIGTERM: %v", err)
	}
	if err := u.srv.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	p := launchProxy(t, u.sb, 5*time.Second, proxyBin, "--proxy-mode=nftables",
		"--kubeconfig", u.srv.ProxyKubeconfig, "--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(), "--iptables-min-sync-period", "100ms")
	u.proxy = p
	// The Starting event cannot be written while the API server is down;
	// its retry can reach the started API server before its authorizer has
	// loaded the RBAC objects, which refuses it as forbidden, once (as in
	// TestFaultAPIServerDownRestart).
	p.expectedErrors = append(p.expectedErrors, "Unable to write event",
		`Server rejected event (will not retry!)" err="events.events.k8s.io is forbidden`)
	// Logged once start-up is done and we wait for the first listing.
	p.waitLog(t, 30*time.Second, "the proxy waiting for the API server", func(lines []string) bool {
		return logHas(lines, "kube-nftproxy running")
	})
	if r := u.nftRuleset(t); !strings.Contains(r, "jump KUBE-SVC-") {
		t.Errorf("before our first sync, kube-proxy's Service rules are gone: the node has no Service rules")
	}
	if err := u.srv.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.waitLog(t, 60*time.Second, "our first sync and then the removal", func(lines []string) bool {
		return countSyncs(lines) > 0 && logHas(lines, "removed upstream kube-proxy's leftovers")
	})
	p.poll(t, 30*time.Second, "the ruleset but ours as before kube-proxy ran", func(context.Context) error {
		if after := withoutOurs(u.ruleset(t)); after != u.before {
			return fmt.Errorf("differs:\n%s", lineDiff(u.before, after))
		}
		return nil
	})
}
