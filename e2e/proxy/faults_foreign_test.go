package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// foreignTable is the proxy's main IPv4 table, where the foreign objects go.
const foreignTable = "ip kube-nftproxy"

// foreignScripts are nft scripts that add another process's objects to the
// proxy's table: rules with anonymous sets, verdict maps and chains (which
// the kernel deletes only with their rule), a named set, and stateful
// objects that a rule uses or nothing does.
var foreignScripts = []struct{ name, script string }{
	{"rule with an anonymous set",
		fmt.Sprintf("add rule %s KUBE-SERVICES ip saddr { 1.2.3.4, 5.6.7.8 } counter\n", foreignTable)},
	{"rule with an anonymous verdict map",
		fmt.Sprintf("insert rule %s KUBE-SERVICES ip saddr vmap { 1.2.3.4 : drop, 5.6.7.8 : accept }\n", foreignTable)},
	{"rule with an anonymous chain",
		fmt.Sprintf("add rule %s KUBE-SERVICES ip saddr 1.2.3.4 jump { counter; }\n", foreignTable)},
	{"named set and a rule using it", fmt.Sprintf(
		"add set %[1]s foreign { type ipv4_addr; elements = { 1.2.3.4 }; }\nadd rule %[1]s KUBE-SERVICES ip saddr @foreign drop\n",
		foreignTable)},
	{"counter used by a rule, quota and ct helper", fmt.Sprintf(
		"add counter %[1]s fc\nadd rule %[1]s KUBE-SERVICES counter name fc\nadd quota %[1]s fq { over 25 mbytes }\n"+
			"add ct helper %[1]s fh { type \"ftp\" protocol tcp; }\n", foreignTable)},
}

// foreignService is a Service with one TCP port on clusterIP and pod-a as
// its endpoint: the change that must reach the kernel after a tampering.
func foreignService(name, clusterIP string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  clusterIP: %[2]s
  clusterIPs: [%[2]s]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: %[5]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-ipv4
  namespace: default
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: %[5]d}]
endpoints:
- addresses: [%[3]s]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: %[4]s
`, name, clusterIP, podA.IPv4, nodeName, podTCPPort)
}

// addForeignService adds Service name on clusterIP after a tampering,
// waits until it answers (returned: how long after it was written), then
// until the kernel holds what render prints, and checks where the
// Service's requests go.
func (e *env) addForeignService(t *testing.T, name, clusterIP string, timeout time.Duration) time.Duration {
	t.Helper()
	writeAtomic(t, e.state, name+".yaml", foreignService(name, clusterIP))
	t0 := time.Now()
	addr := hostPort(clusterIP, webPort)
	e.proxy.poll(t, timeout, "Service "+name+" to answer", func(ctx context.Context) error {
		_, err := e.client(ctx, podC.Name, "tcp", addr, 1, "--timeout", "200ms")
		return err
	})
	answered := time.Since(t0)
	e.waitRendered(t, timeout, "the tampering repaired and Service "+name+" programmed")
	sum := e.requests(t, podC.Name, "tcp", addr, requestsPerCheck)
	expectBackends(t, "Service "+name+" added after the tampering", sum, podA.Name)
	return answered
}

// Sync metrics: the time of the last successful sync, and the failed ones.
const (
	metricLastSync    = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	metricSyncFailure = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
)

// syncMetrics polls /metrics until it answers.
func (e *env) syncMetrics(t *testing.T) metrics {
	t.Helper()
	var m metrics
	e.proxy.poll(t, 10*time.Second, "/metrics", func(ctx context.Context) error {
		var err error
		m, err = (&apiEnv{env: e}).fetchMetrics(ctx)
		return err
	})
	return m
}

// waitSyncAttempt polls /metrics until a sync ran that started at or
// after at (the periodic one at the latest): one succeeded then, or one
// failed since before was read. It returns the metrics then.
func (e *env) waitSyncAttempt(t *testing.T, at time.Time, before metrics, timeout time.Duration) metrics {
	t.Helper()
	var m metrics
	e.proxy.poll(t, timeout, "a sync after "+at.UTC().Format("15:04:05.000"), func(ctx context.Context) error {
		var err error
		if m, err = (&apiEnv{env: e}).fetchMetrics(ctx); err != nil {
			return err
		}
		if m[metricLastSync] >= float64(at.UnixNano())/1e9 || m[metricSyncFailure] > before[metricSyncFailure] {
			return nil
		}
		return fmt.Errorf("last sync at %v", m[metricLastSync])
	})
	return m
}

// expectNoFailedSync fails the test if a sync failed between the two
// readings of /metrics: the repair must not need a retry.
func expectNoFailedSync(t *testing.T, before, after metrics) {
	t.Helper()
	if n := after[metricSyncFailure] - before[metricSyncFailure]; n > 0 {
		t.Errorf("%v syncs failed (see the proxy's log)", n)
	}
}

// TestFaultForeignObjects adds another process's objects to the proxy's
// table (issue "Never stuck, never silent", fault 1), one case at a time
// under traffic to the example's Services, then adds a Service: the
// change monitor's check finds the objects, the repair removes them, and
// the new Service reaches the kernel, which then lists exactly what render
// prints. On the code before the fix, a rule with an anonymous set made
// every sync fail ("delete set __set0": no such file or directory), and
// stateful objects were never seen.
func TestFaultForeignObjects(t *testing.T) {
	t.Parallel()
	args := []string{"--iptables-sync-period", tamperSyncPeriod.String()}
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, proxyArgs: args})
	e.waitRendered(t, 10*time.Second, "before tampering")
	for i, tc := range foreignScripts {
		ok := t.Run(tc.name, func(t *testing.T) {
			e.proxy.checkRunning(t)
			f := e.startExampleFlows(t)
			before := e.syncMetrics(t)
			t0 := time.Now()
			if err := e.nftScript(t.Context(), tc.script); err != nil {
				t.Fatal(err)
			}
			answered := e.addForeignService(t, fmt.Sprintf("foreign-%d", i), fmt.Sprintf("10.96.3.%d", 10+i), 6*tamperSyncPeriod)
			repaired := time.Since(t0)
			t.Logf("the Service added after the tampering answered %v after it was written", answered.Round(time.Millisecond))
			res := f.stop(t)
			res.expectNoFailures(t, "the example's Services while "+tc.name+" was repaired")
			// The follow-up sync deletes the chains the repair flushed (a
			// second later): before the fix, an anonymous chain among them.
			after := e.waitSyncAttempt(t, time.Now().Add(time.Second), before, 3*tamperSyncPeriod)
			expectNoFailedSync(t, before, after)
			logFault(t, "foreign: "+tc.name, repaired, res)
		})
		if !ok {
			e.resetProxy(t, args...) // judge the next case on its own
		}
	}
	e.proxy.checkRunning(t)
}

// TestFaultForeignObjectsAtRestart restarts the proxy onto a table that
// another process added objects to while it was down: the first sync of
// the new process removes them and programs a Service added meanwhile.
// Before the fix, every sync of the new process failed (a liveness restart
// crash-looped), and no Service change reached the kernel.
func TestFaultForeignObjectsAtRestart(t *testing.T) {
	t.Parallel()
	args := []string{"--iptables-sync-period", tamperSyncPeriod.String()}
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, proxyArgs: args})
	e.waitRendered(t, 10*time.Second, "before the restart")
	f := e.startExampleFlows(t)
	e.proxy.stop(t)
	t0 := time.Now()
	for _, tc := range foreignScripts {
		if err := e.nftScript(t.Context(), tc.script); err != nil {
			t.Fatal(err)
		}
	}
	expected := e.proxy.expectedErrors
	e.proxy = launchProxy(t, e.sb, 5*time.Second, proxyCommand(e.state, args...)...)
	e.proxy.expectedErrors = expected
	answered := e.addForeignService(t, "foreign-restart", "10.96.3.50", 6*tamperSyncPeriod)
	repaired := time.Since(t0)
	t.Logf("the Service added after the restart answered %v after it was written", answered.Round(time.Millisecond))
	res := f.stop(t)
	res.expectNoFailures(t, "the example's Services across the restart")
	expectNoFailedSync(t, metrics{}, e.waitSyncAttempt(t, time.Now().Add(time.Second), metrics{}, 3*tamperSyncPeriod))
	logFault(t, "foreign: restart onto every foreign object above", repaired, res)
}
