package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestStaleChainsDeleted: the chains of a removed Service are emptied by
// the sync that removes it and deleted by a follow-up sync about a second
// later (once the kernel has released them), not at the next periodic
// sync (30 s): `nft list ruleset` then shows nothing of the Service, and no
// transaction failed on the way.
func TestStaleChainsDeleted(t *testing.T) {
	t.Parallel()
	svc := policyService{
		name: "gone", clusterIPv4: netip.MustParseAddr("10.96.91.1"), clusterIPv6: netip.MustParseAddr("fd00:10:96::91:1"),
		ports: []policyPort{policyHTTP.withNodePort(30091)},
	}
	e := newPolicyEnv(t, documents(svc.yaml(), policySlices(svc, policyReady(podA, ""), policyReady(podB, ""))), nil)
	policyExpect(t, e, podC.Name, "tcp", policyAddr(svc.clusterIPv4, policyHTTP.port), nil, podA, podB)
	const comment = `"policy/gone:http`
	// The chains carrying the Service's comment (emptied ones keep it).
	chains := func(ruleset string) []string {
		var out []string
		lines := strings.Split(ruleset, "\n")
		for i, l := range lines {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "chain" && i+1 < len(lines) && strings.Contains(lines[i+1], "comment "+comment) {
				out = append(out, f[1])
			}
		}
		return out
	}
	if before := e.nftRuleset(t); len(chains(before)) == 0 {
		t.Fatalf("no chain of %s in the ruleset:\n%s", comment, before)
	}

	writeAtomic(t, e.state, policyStateFile, "# the Service is gone\n")
	removed := time.Now()
	var emptied time.Duration // when only its (empty) chains were left
	e.proxy.poll(t, 3*time.Second, "the removed Service's chains to be deleted", func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		ruleset := string(out)
		if !strings.Contains(ruleset, comment) {
			return nil
		}
		if emptied == 0 && !strings.Contains(ruleset, "10.96.91.1") {
			emptied = time.Since(removed)
		}
		return fmt.Errorf("still in the ruleset (chains %v)", chains(ruleset))
	})
	gone := time.Since(removed)
	t.Logf("MEASURED Service removed -> its map elements gone after %v, its chains deleted after %v", emptied.Round(time.Millisecond), gone.Round(time.Millisecond))
	lines := e.proxy.log.lines()
	if !slices.ContainsFunc(lines, func(l string) bool { return isLogMsg(l, "deleted stale chains") }) {
		t.Errorf("the proxy did not log the deletion of the stale chains")
	}
	for _, l := range lines {
		if strings.Contains(l, "sync failed") {
			t.Errorf("a sync failed: %s", l)
		}
	}
	// The rest is what a full sync of the remaining state programs.
	e.waitRendered(t, 5*time.Second, "the ruleset after the removal")
}
