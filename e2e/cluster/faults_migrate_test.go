package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// switchedLabel marks a node moved to kube-nftproxy: kube-proxy's
// DaemonSet stays off it, ours runs only there (README, "Moving from
// kube-proxy", step 3).
const switchedLabel = "kube-nftproxy/switched"

// TestClusterFaultMigration starts the cluster with upstream kube-proxy
// v1.37.1 (iptables mode) and, with the client's streams and the
// long-lived flows running, follows docs/migration.md node by node: save
// iptables-save and the objects, `kube-nftproxy diff` against --state
// (must say equal), keep kube-proxy's DaemonSet off the node and run ours
// there, `diff` against our live tables. Then kube-proxy's own --cleanup
// with iptables-legacy; then the way back, node by node (step 6), with
// kube-proxy's rules checked by diff after our --cleanup; then forward
// again, and the DaemonSets' last step. Each part prints the FAULT and
// FLOWS lines, and what kube-proxy left in iptables-nft and iptables-legacy.
func TestClusterFaultMigration(t *testing.T) { migrationFaults(t, ProxyUpstream, "iptables") }

// TestClusterFaultMigrationNFTables is the same from kube-proxy's nftables
// mode: `nft list ruleset` and `diff --nft-ruleset` in steps 1, 2 and 4,
// deploy/ as it is (nftables mode, least privilege), no iptables-legacy
// step.
func TestClusterFaultMigrationNFTables(t *testing.T) {
	migrationFaults(t, ProxyUpstreamNFT, "nftables")
}

func migrationFaults(t *testing.T, proxy, mode string) {
	l, imgs := faultsCluster(t, proxy)
	ctx, cancel := testContext(t)
	defer cancel()
	r := l.faultsWorkloads(ctx, t)
	defer r.finish(t)
	m := &migration{l: l, t: t, dir: t.TempDir(), bin: imgs.binA, image: imgs.a.Ref, mode: mode}
	for _, n := range l.Nodes {
		t.Logf("%s before the switch: kube-proxy's rules in %s", n.Name, m.backends(ctx, n))
	}
	r.measure(ctx, t, "cluster-migrate", func() error { return m.switchAll(ctx, true) })
	for _, n := range l.Nodes {
		t.Logf("%s after the switch: kube-proxy's rules in %s", n.Name, m.backends(ctx, n))
	}
	if mode == "iptables" {
		m.legacyCleanup(ctx, r)
	}
	r.measure(ctx, t, "cluster-rollback", func() error {
		for _, n := range l.Nodes {
			if err := m.rollBack(ctx, n); err != nil {
				return err
			}
		}
		return nil
	})
	r.measure(ctx, t, "cluster-migrate-again", func() error { return m.switchAll(ctx, false) })
	r.measure(ctx, t, "cluster-migrate-finish", func() error { return m.finish(ctx) })
}

// legacyCleanup is the README's remedy for rules in iptables-legacy,
// whether or not there are any: kube-proxy --cleanup with iptables-legacy
// on each node must not disturb ours.
func (m *migration) legacyCleanup(ctx context.Context, r *faultRun) {
	m.t.Helper()
	r.measure(ctx, m.t, "cluster-migrate-kube-proxy-cleanup", func() error {
		for _, n := range m.l.Nodes {
			if err := m.kubeProxyCleanup(ctx, n); err != nil {
				return err
			}
			if err := m.diffLive(ctx, n); err != nil {
				return err
			}
			m.t.Logf("%s after kube-proxy --cleanup: %s", n.Name, m.backends(ctx, n))
		}
		return nil
	})
}

// switchAll is steps 1 to 4 on every node in turn; prepare runs step 3's
// one-time part before the first node.
func (m *migration) switchAll(ctx context.Context, prepare bool) error {
	for i, n := range m.l.Nodes {
		if err := m.saveAndDiff(ctx, n); err != nil {
			return err
		}
		if i == 0 && prepare {
			if err := m.prepareDaemonSets(ctx); err != nil {
				return err
			}
		}
		if err := m.switchNode(ctx, n); err != nil {
			return err
		}
		if err := m.diffLive(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// rollBack is step 6 on node n: ours off the node (the label's value no
// longer matches our nodeSelector, and kube-proxy's nodeAffinity still
// keeps it away), then the label removed so kube-proxy starts there, its
// rules checked by steps 1 and 2 (its live dump against the objects), then
// `kube-nftproxy --cleanup` on the node, and the check again.
func (m *migration) rollBack(ctx context.Context, n Node) error {
	start := time.Now()
	if _, err := m.l.kubectl(ctx, "label", "node", n.Name, switchedLabel+"=rollback", "--overwrite"); err != nil {
		return fmt.Errorf("step 6 on %s: %w", n.Name, err)
	}
	if err := m.waitProxyOn(ctx, "kube-nftproxy", n, false); err != nil {
		return fmt.Errorf("step 6 on %s, ours leaving: %w", n.Name, err)
	}
	m.logf("step 6 on %s: ours gone after %v", n.Name, time.Since(start).Round(100*time.Millisecond))
	if _, err := m.l.kubectl(ctx, "label", "node", n.Name, switchedLabel+"-"); err != nil {
		return fmt.Errorf("step 6 on %s: %w", n.Name, err)
	}
	if err := m.waitProxyOn(ctx, "kube-proxy", n, true); err != nil {
		return fmt.Errorf("step 6 on %s, kube-proxy starting: %w", n.Name, err)
	}
	m.logf("step 6 on %s: kube-proxy Ready after %v", n.Name, time.Since(start).Round(100*time.Millisecond))
	if err := m.saveAndDiff(ctx, n); err != nil {
		return fmt.Errorf("step 6 on %s, kube-proxy's rules before our --cleanup: %w", n.Name, err)
	}
	argv := nsenter(n.Name, m.bin, "--cleanup")
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	m.logf("step 6 on %s: kube-nftproxy --cleanup: err %v, output:\n%s", n.Name, err, out)
	if err != nil {
		return fmt.Errorf("step 6 on %s: kube-nftproxy --cleanup: %w", n.Name, err)
	}
	if err := m.saveAndDiffOnce(ctx, n); err != nil {
		return fmt.Errorf("step 6 on %s, kube-proxy's rules after our --cleanup: %w", n.Name, err)
	}
	m.logf("step 6 on %s: done in %v; %s", n.Name, time.Since(start).Round(100*time.Millisecond), m.backends(ctx, n))
	return nil
}

// waitProxyOn waits until DaemonSet ds has a Ready pod on n (present) or
// none at all, not even a terminating one (not present).
func (m *migration) waitProxyOn(ctx context.Context, ds string, n Node, present bool) error {
	return poll(ctx, 3*time.Minute, func() (bool, error) {
		pods, err := m.l.proxyPods(ctx, ds)
		if err != nil {
			return false, nil
		}
		for _, p := range pods {
			if p.node == n.Name {
				return present && p.ready && !p.deleting, nil
			}
		}
		return !present, nil
	})
}

// finish is what follows the last node (the README does not say it): the
// kube-proxy DaemonSet deleted, and the label dropped from ours'
// nodeSelector, which rolls it on every node.
func (m *migration) finish(ctx context.Context) error {
	if _, err := m.l.kubectl(ctx, "-n", "kube-system", "delete", "daemonset", "kube-proxy"); err != nil {
		return err
	}
	start := time.Now()
	if _, err := m.l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", "kube-nftproxy", "--type=json",
		"-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector/`+strings.ReplaceAll(switchedLabel, "/", "~1")+`"}]`); err != nil {
		return err
	}
	if err := m.l.waitRollout(ctx, "kube-system", "daemonset/kube-nftproxy"); err != nil {
		return err
	}
	if _, err := m.l.waitProxyPods(ctx, "kube-nftproxy", nil, ""); err != nil {
		return err
	}
	m.logf("kube-proxy's DaemonSet deleted, ours rolled without the label in its nodeSelector in %v", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// kubeProxyCleanup runs `kube-proxy --cleanup` (the binary upstream's image
// holds) in the node's network namespace with iptables-legacy as its
// iptables, as the README says to when our start-up warns about
// iptables-legacy chains.
func (m *migration) kubeProxyCleanup(ctx context.Context, n Node) error {
	shim := filepath.Join(m.dir, "legacy-bin")
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return err
	}
	for _, tool := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		link := filepath.Join(shim, tool)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink("/usr/sbin/xtables-legacy-multi", link); err != nil {
				return err
			}
		}
	}
	argv := nsenter(n.Name, "env", "PATH="+shim+":/usr/sbin:/usr/bin:/sbin:/bin", m.l.K8sBin("kube-proxy"), "--cleanup", "--v=2")
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	m.logf("kube-proxy --cleanup (iptables-legacy) on %s: err %v, output:\n%s", n.Name, err, out)
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup on %s: %w", n.Name, err)
	}
	return nil
}

// migration runs the README's steps; bin is kube-nftproxy for the host.
type migration struct {
	l        Layout
	t        *testing.T
	dir, bin string
	image    string
	mode     string // kube-proxy's and ours: iptables or nftables
}

// logf logs with the wall clock, to line steps up with failed requests.
func (m *migration) logf(format string, args ...any) {
	m.t.Helper()
	m.t.Logf("%s "+format, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (m *migration) nodeDir(n Node) string { return filepath.Join(m.dir, n.Name) }

// diffAttempts is how many times steps 1 and 2 run when diff says
// different: the dumps and the objects are taken at different moments, so
// a change kube-proxy has not synced yet shows as a difference once.
const diffAttempts = 3

// saveAndDiff is steps 1 and 2, again (after 5 s) while diff says different.
func (m *migration) saveAndDiff(ctx context.Context, n Node) error {
	var err error
	for i := 1; i <= diffAttempts; i++ {
		if err = m.saveAndDiffOnce(ctx, n); err == nil {
			return nil
		}
		m.logf("steps 1 and 2 on %s, attempt %d of %d: %v", n.Name, i, diffAttempts, err)
		if i < diffAttempts {
			if werr := wait(ctx, 5*time.Second); werr != nil {
				return werr
			}
		}
	}
	return err
}

// saveAndDiffOnce is steps 1 and 2: the node's rules (iptables-save and
// ip6tables-save, or nft list ruleset), the objects into
// state/cluster.yaml, and diff against --state.
func (m *migration) saveAndDiffOnce(ctx context.Context, n Node) error {
	dir := m.nodeDir(n)
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		return err
	}
	for file, cmd := range m.dumps() {
		out, err := output(ctx, nsenter(n.Name, cmd...)...)
		if err != nil {
			return fmt.Errorf("step 1 on %s: %w", n.Name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(out), 0o644); err != nil {
			return err
		}
	}
	objs, err := m.l.kubectl(ctx, "get", "svc,endpointslices,nodes", "-A", "-o", "yaml")
	if err != nil {
		return fmt.Errorf("step 1: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state", "cluster.yaml"), []byte(objs), 0o644); err != nil {
		return err
	}
	out, err := m.diff(ctx, "", n, "--state", filepath.Join(dir, "state"), "--hostname-override", n.Name,
		"--cluster-cidr", ClusterCIDR, "--proxy-mode", m.mode)
	m.logf("step 2 on %s, diff --state: %s", n.Name, out)
	if err != nil {
		return fmt.Errorf("step 2 on %s: diff against --state: %w", n.Name, err)
	}
	return nil
}

// dumps are step 1's files and the commands that write them, by mode.
func (m *migration) dumps() map[string][]string {
	if m.mode == "nftables" {
		return map[string][]string{"ruleset.txt": {"nft", "list", "ruleset"}}
	}
	return map[string][]string{"v4.txt": {"iptables-save"}, "v6.txt": {"ip6tables-save"}}
}

// diff runs `kube-nftproxy diff` with the node's saved dumps and extra
// flags, in network namespace ns (none: here), and returns its output.
func (m *migration) diff(ctx context.Context, ns string, n Node, extra ...string) (string, error) {
	argv := []string{m.bin, "diff", "--iptables-save", filepath.Join(m.nodeDir(n), "v4.txt"),
		"--iptables-save", filepath.Join(m.nodeDir(n), "v6.txt")}
	if m.mode == "nftables" {
		argv = []string{m.bin, "diff", "--nft-ruleset", filepath.Join(m.nodeDir(n), "ruleset.txt")}
	}
	argv = append(argv, extra...)
	if ns != "" {
		argv = nsenter(ns, argv...)
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	return summarizeDiff(string(out)), err
}

// summarizeDiff keeps the lines of a diff report that are not "equal",
// and its last line.
func summarizeDiff(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var keep []string
	equal := 0
	for i, line := range lines {
		if strings.Contains(line, ": equal") && i < len(lines)-1 {
			equal++
			continue
		}
		keep = append(keep, line)
	}
	return fmt.Sprintf("%d Service ports equal; %s", equal, strings.Join(keep, "\n"))
}

// prepareDaemonSets is step 3's one-time part: kube-proxy's DaemonSet gets
// a nodeAffinity that excludes the label, and deploy/ is applied with a
// nodeSelector on it (so it runs nowhere yet).
func (m *migration) prepareDaemonSets(ctx context.Context) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":%q,"operator":"DoesNotExist"}]}]}}}}}}}`, switchedLabel)
	m.logf("step 3: kube-proxy's nodeAffinity")
	if _, err := m.l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", "kube-proxy", "--type=strategic", "-p", patch); err != nil {
		return fmt.Errorf("step 3, kube-proxy's nodeAffinity: %w", err)
	}
	start := time.Now()
	if err := m.l.waitRollout(ctx, "kube-system", "daemonset/kube-proxy"); err != nil {
		return fmt.Errorf("step 3, kube-proxy's rollout: %w", err)
	}
	m.logf("step 3: kube-proxy's DaemonSet rolled with the nodeAffinity in %v", time.Since(start).Round(100*time.Millisecond))
	dir := deployDir() // nftables mode: deploy/ as it is
	if m.mode != "nftables" {
		dir = filepath.Join(dir, "iptables") // the overlay: iptables mode in both containers
	}
	manifests, err := DeployManifests(ctx, m.l.KubectlBin(), dir, m.image, m.l.APIServerURL())
	if err != nil {
		return err
	}
	manifests, err = withNodeSelector(manifests, switchedLabel, "true")
	if err != nil {
		return err
	}
	if err := m.l.apply(ctx, "kube-nftproxy-migration", manifests); err != nil {
		return err
	}
	if m.mode == "nftables" {
		return nil
	}
	// Privileged, as docs/migration.md says for iptables mode: localhost
	// NodePorts need route_localnet, which /proc/sys read-only refuses.
	patchFile, err := filepath.Abs(privilegedPatch(deployDir()))
	if err != nil {
		return err
	}
	if _, err := m.l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", "kube-nftproxy", "--patch-file", patchFile); err != nil {
		return fmt.Errorf("step 3, the privileged variant: %w", err)
	}
	return nil
}

// withNodeSelector adds key: value to the one pod template's nodeSelector,
// creating it if the template has none.
func withNodeSelector(manifests, key, value string) (string, error) {
	const tmpl, spec, sel = "\n  template:\n", "\n    spec:\n", "\n      nodeSelector:\n"
	i := strings.Index(manifests, tmpl)
	if i < 0 || strings.Count(manifests, tmpl) != 1 {
		return "", errors.New("deploy manifests: want exactly one pod template")
	}
	j := strings.Index(manifests[i:], spec)
	if j < 0 {
		return "", errors.New("deploy manifests: the pod template has no spec")
	}
	at, add := i+j+len(spec), fmt.Sprintf("      nodeSelector:\n        %s: %q\n", key, value)
	if k := strings.Index(manifests[at-1:], sel); k >= 0 && strings.Count(manifests[at-1:], sel) == 1 {
		at, add = at-1+k+len(sel), fmt.Sprintf("        %s: %q\n", key, value)
	}
	return manifests[:at] + add + manifests[at:], nil
}

// switchNode labels the node and waits until kube-proxy's pod has left it
// and ours is Ready there.
func (m *migration) switchNode(ctx context.Context, n Node) error {
	start := time.Now()
	m.logf("step 3 on %s: label", n.Name)
	if _, err := m.l.kubectl(ctx, "label", "node", n.Name, switchedLabel+"=true"); err != nil {
		return fmt.Errorf("step 3 on %s: %w", n.Name, err)
	}
	err := poll(ctx, 3*time.Minute, func() (bool, error) {
		theirs, err1 := m.l.proxyPods(ctx, "kube-proxy")
		ours, err2 := m.l.proxyPods(ctx, "kube-nftproxy")
		if err1 != nil || err2 != nil {
			return false, nil
		}
		for _, p := range theirs {
			if p.node == n.Name {
				return false, nil
			}
		}
		for _, p := range ours {
			if p.node == n.Name && p.ready && !p.deleting {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("step 3 on %s: %w", n.Name, err)
	}
	m.logf("step 3 on %s: kube-proxy gone, kube-nftproxy Ready after %v", n.Name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// diffLive is step 4: diff the saved dumps against our live tables.
func (m *migration) diffLive(ctx context.Context, n Node) error {
	out, err := m.diff(ctx, n.Name, n)
	m.logf("step 4 on %s, diff against the live tables: %s", n.Name, out)
	if err != nil {
		return fmt.Errorf("step 4 on %s: %w", n.Name, err)
	}
	return nil
}

var kubeChain = regexp.MustCompile(`(?m)^:(KUBE-[A-Z0-9-]+)`)

// backends says, per iptables backend and family, how many KUBE-* chains
// the node holds and which non-service ones.
func (m *migration) backends(ctx context.Context, n Node) string {
	var parts []string
	for _, cmd := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := output(ctx, nsenter(n.Name, cmd)...)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", cmd, err))
			continue
		}
		var names []string
		for _, mt := range kubeChain.FindAllStringSubmatch(out, -1) {
			names = append(names, mt[1])
		}
		sort.Strings(names)
		parts = append(parts, fmt.Sprintf("%s: %d KUBE-* chains %s", cmd, len(names), abbreviate(names)))
	}
	return strings.Join(parts, "; ")
}

// abbreviate lists the chains that are not per service, and counts those.
func abbreviate(names []string) string {
	var fixed []string
	per := 0
	for _, n := range names {
		if strings.HasPrefix(n, "KUBE-SVC-") || strings.HasPrefix(n, "KUBE-SEP-") || strings.HasPrefix(n, "KUBE-EXT-") ||
			strings.HasPrefix(n, "KUBE-SVL-") || strings.HasPrefix(n, "KUBE-FW-") {
			per++
			continue
		}
		fixed = append(fixed, n)
	}
	return fmt.Sprintf("(%d per service, %s)", per, strings.Join(fixed, " "))
}
