package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The API-gone tests run the proxy with a short sync period: /readyz
// must turn 503 once the API server has been away for twice this.
// KNP_APIGONE_SYNC_PERIOD sets another (30s: kube-proxy's default).
var apiGoneSyncPeriod = envDuration("KNP_APIGONE_SYNC_PERIOD", 2*time.Second)

// apiGoneHold is how long the API server stays away after the proxy has
// reported it (KNP_APIGONE_HOLD, default 0: the long outages of a real
// cluster are a matter of setting it to 90s).
var apiGoneHold = envDuration("KNP_APIGONE_HOLD", 0)

func envDuration(name string, def time.Duration) time.Duration {
	d, err := time.ParseDuration(os.Getenv(name))
	if err != nil || d <= 0 {
		return def
	}
	return d
}

// The Service deleted while (or right after) the API server is away.
const (
	apiGoneDoomedName = "api-doomed"
	apiGoneDoomedIP   = "10.96.1.66"
)

// apiGonePort is the port the proxy connects to in the blackhole test:
// redirected to the API server's own, so that dropping the packets of
// this port cuts the proxy off while the test still reaches the server.
const apiGonePort = 16443

// apiGoneFault takes the API server away from the proxy and brings it back.
type apiGoneFault struct {
	name string
	// viaRedirect: the proxy connects through apiGonePort.
	viaRedirect bool
	// deleteWhileAway: the test deletes the doomed Service while the
	// proxy cannot see the server (else right after it is back).
	deleteWhileAway bool
	away, back      func(t *testing.T, a *apiEnv)
}

// TestFaultAPIServerGone takes the API server away from a running proxy in
// three ways: killed (connections refused), hung with SIGSTOP (connections
// open, nothing answered) and blackholed (every packet dropped, no RST).
// Each time the proxy must say so as the README promises: a warning, a
// count in kubenftproxy_source_failures_total{source="api"},
// kubenftproxy_source_up 0, /readyz 503 after twice the sync period; and
// when the server is back: source_up 1, /readyz 200, an info line, and a
// Service deleted meanwhile (or right then) gone from the kernel within
// seconds.
func TestFaultAPIServerGone(t *testing.T) {
	t.Parallel()
	faults := []apiGoneFault{
		{name: "killed", away: apiGoneKill, back: apiGoneRestart},
		{name: "stopped", away: apiGoneSignal(syscall.SIGSTOP), back: apiGoneSignal(syscall.SIGCONT)},
		{name: "blackholed", viaRedirect: true, deleteWhileAway: true, away: apiGoneDrop, back: apiGoneUndrop},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { testAPIGone(t, f) })
	}
}

func testAPIGone(t *testing.T, f apiGoneFault) {
	a := newAPIEnv(t)
	a.do(t, "POST", servicesPath, apiService(apiWebName, apiWebIP, nil), nil)
	a.do(t, "POST", slicesPath, apiSlice(apiWebName, nil, podA, podB), nil)
	a.do(t, "POST", servicesPath, apiService(apiGoneDoomedName, apiGoneDoomedIP, nil), nil)
	a.do(t, "POST", slicesPath, apiSlice(apiGoneDoomedName, nil, podA), nil)
	t.Cleanup(func() { _ = a.srv.SignalAPIServer(syscall.SIGCONT) })
	a.proxy.stop(t)
	a.proxy = a.launchGoneProxy(t, f.viaRedirect)
	a.waitRuleset(t, "the doomed Service programmed", func(rs string) bool { return strings.Contains(rs, apiGoneDoomedIP) })
	web := hostPort(apiWebIP, webPort)
	a.waitTraffic(t, time.Now(), 10*time.Second, web, podA.Name, podB.Name)
	failuresBefore := a.goneMetric(t, `kubenftproxy_source_failures_total{source="api"}`)
	logged := len(a.proxy.log.lines())

	t0 := time.Now()
	f.away(t, a)
	seen := a.waitGoneReported(t, t0, logged, failuresBefore)
	t.Logf("%s: warning logged %v, failure counted and source_up 0 %v, /readyz 503 %v after the server went away",
		f.name, seen.warned.Round(time.Millisecond), seen.counted.Round(time.Millisecond), seen.unhealthy.Round(time.Millisecond))
	if seen.unhealthy < 2*apiGoneSyncPeriod {
		t.Errorf("/readyz turned 503 %v after the server went away, before twice the sync period (%v)", seen.unhealthy, 2*apiGoneSyncPeriod)
	}
	a.holdGone(t, t0)
	if f.deleteWhileAway {
		a.deleteDoomed(t)
	}
	logged = len(a.proxy.log.lines())
	f.back(t, a)
	back := time.Now()
	if !f.deleteWhileAway {
		a.deleteDoomed(t)
	}
	deleted := time.Now()
	// A deletion made while the server was away must not wait for the
	// informers' backoff (up to a minute): 15 s is generous for this
	// machine, and about three times what the fix needs at worst.
	a.proxy.poll(t, 15*time.Second, "the doomed Service to leave the kernel", func(ctx context.Context) error {
		rs, err := a.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		if strings.Contains(string(rs), apiGoneDoomedIP) {
			return errors.New("its ClusterIP is still in the ruleset")
		}
		return nil
	})
	gone := time.Now()
	a.waitGoneRecovered(t, logged)
	t.Logf("%s: server back -> the deletion in the kernel %v (deletion request -> kernel %v); recovery reported %v after the server was back",
		f.name, gone.Sub(back).Round(time.Millisecond), gone.Sub(deleted).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	a.waitTraffic(t, time.Now(), 10*time.Second, web, podA.Name, podB.Name)
	a.proxy.checkRunning(t)
}

// deleteDoomed deletes the doomed Service, trying again when the test's
// own connection to the server did not survive the fault (EOF after a
// long SIGSTOP); a 404 says an earlier try went through.
func (a *apiEnv) deleteDoomed(t *testing.T) {
	t.Helper()
	a.proxy.poll(t, 30*time.Second, "deleting the doomed Service", func(ctx context.Context) error {
		err := a.srv.Do(ctx, "DELETE", servicesPath+"/"+apiGoneDoomedName, nil, nil)
		if se, ok := errors.AsType[*apiserver.StatusError](err); ok && se.Code == http.StatusNotFound {
			return nil
		}
		return err
	})
}

// holdGone keeps the server away until apiGoneHold after t0, checking
// that the proxy keeps saying so.
func (a *apiEnv) holdGone(t *testing.T, t0 time.Time) {
	t.Helper()
	if time.Since(t0) >= apiGoneHold {
		return
	}
	a.proxy.poll(t, apiGoneHold+10*time.Second, fmt.Sprintf("%v away", apiGoneHold), func(ctx context.Context) error {
		m, err := a.fetchMetrics(ctx)
		if err != nil {
			return err
		}
		if up := m[`kubenftproxy_source_up{source="api"}`]; up != 0 {
			t.Errorf("%v after the server went away, source_up is %v", time.Since(t0).Round(time.Millisecond), up)
		}
		if time.Since(t0) < apiGoneHold {
			return errors.New("holding")
		}
		return nil
	})
}

// launchGoneProxy starts the proxy with the short sync period, through
// apiGonePort when viaRedirect, and waits for its first sync.
func (a *apiEnv) launchGoneProxy(t *testing.T, viaRedirect bool) *proxy {
	t.Helper()
	master := a.srv.URL
	if viaRedirect {
		_, port, err := net.SplitHostPort(a.srv.Host)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.nftScript(t.Context(), fmt.Sprintf(`table ip knp-e2e-redirect {
	chain out { type nat hook output priority -100; ip daddr 127.0.0.1 tcp dport %d redirect to :%s; }
}`, apiGonePort, port)); err != nil {
			t.Fatal(err)
		}
		master = fmt.Sprintf("https://127.0.0.1:%d", apiGonePort)
	}
	p := launchProxy(t, a.sb, 10*time.Second, proxyBin, "--proxy-mode=nftables",
		"--kubeconfig", a.srv.ProxyKubeconfig, "--master", master,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms",
		"--iptables-sync-period", apiGoneSyncPeriod.String(),
	)
	p.waitLog(t, 30*time.Second, "the proxy's first sync from the API server", func(lines []string) bool {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "API server caches filled") })
		return i >= 0 && countSyncs(lines[i:]) > 0
	})
	return p
}

func apiGoneKill(t *testing.T, a *apiEnv) {
	if err := a.srv.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
}

func apiGoneRestart(t *testing.T, a *apiEnv) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := a.srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
}

func apiGoneSignal(sig syscall.Signal) func(t *testing.T, a *apiEnv) {
	return func(t *testing.T, a *apiEnv) {
		if err := a.srv.SignalAPIServer(sig); err != nil {
			t.Fatal(err)
		}
	}
}

// apiGoneDrop drops every packet of the proxy's connections to the API
// server (those to apiGonePort, in both directions), in the node
// namespace: no RST, no ICMP, as a cut cable or a dead host.
func apiGoneDrop(t *testing.T, a *apiEnv) {
	if err := a.nftScript(t.Context(), fmt.Sprintf(`table ip knp-e2e-blackhole {
	chain out { type filter hook output priority 0; meta l4proto tcp ct original proto-dst %d drop; }
}`, apiGonePort)); err != nil {
		t.Fatal(err)
	}
}

func apiGoneUndrop(t *testing.T, a *apiEnv) {
	if err := a.nftScript(t.Context(), "delete table ip knp-e2e-blackhole"); err != nil {
		t.Fatal(err)
	}
}

// apiGoneSeen is when each report came, after the server went away.
type apiGoneSeen struct {
	warned, counted, unhealthy time.Duration
}

// waitGoneReported polls until the proxy has logged the warning, counted
// a failure with source_up 0, and answers /readyz with 503.
func (a *apiEnv) waitGoneReported(t *testing.T, t0 time.Time, logged int, failuresBefore float64) apiGoneSeen {
	t.Helper()
	var seen apiGoneSeen
	var last, unhealthyBody string
	err := a.proxy.try(t.Context(), 3*apiGoneSyncPeriod+30*time.Second, func(ctx context.Context) error {
		if seen.warned == 0 && slices.ContainsFunc(a.proxy.log.lines()[logged:], isGoneWarning) {
			seen.warned = time.Since(t0)
		}
		if seen.counted == 0 {
			m, err := a.fetchMetrics(ctx)
			if err != nil {
				return err
			}
			failures, up := m[`kubenftproxy_source_failures_total{source="api"}`], m[`kubenftproxy_source_up{source="api"}`]
			last = fmt.Sprintf("failures %v (were %v), source_up %v", failures, failuresBefore, up)
			if failures > failuresBefore && up == 0 {
				seen.counted = time.Since(t0)
			}
		}
		if seen.unhealthy == 0 {
			if code, body, err := a.health(ctx, "/readyz"); err == nil && code == 503 {
				seen.unhealthy, unhealthyBody = time.Since(t0), body
			}
		}
		if seen.warned == 0 || seen.counted == 0 || seen.unhealthy == 0 {
			return fmt.Errorf("warned after %v, counted after %v (%s), /readyz 503 after %v", seen.warned, seen.counted, last, seen.unhealthy)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v after the API server went away, the proxy has not reported it as promised: %v", time.Since(t0).Round(time.Millisecond), err)
	}
	// The health port is open to the network: the body says which source
	// fails, never its error with the API server's address.
	if !strings.Contains(unhealthyBody, `"sourceFailing":"api"`) || strings.Contains(unhealthyBody, a.srv.Host) || strings.Contains(unhealthyBody, "https://") {
		t.Errorf("/readyz 503 body %s: want sourceFailing api and no address of the API server (%s)", unhealthyBody, a.srv.Host)
	}
	return seen
}

func isGoneWarning(l string) bool {
	return isWarningLine(l) && strings.Contains(l, `source="api"`) &&
		strings.Contains(l, "cannot read the source of Services")
}

// waitGoneRecovered polls until the proxy reports the server back: the
// info line, source_up 1 and /readyz 200.
func (a *apiEnv) waitGoneRecovered(t *testing.T, logged int) {
	t.Helper()
	a.proxy.poll(t, 2*apiGoneSyncPeriod+10*time.Second, "the recovery to be reported", func(ctx context.Context) error {
		if !slices.ContainsFunc(a.proxy.log.lines()[logged:], func(l string) bool {
			return isInfoLine(l) && strings.Contains(l, `source="api"`) && strings.Contains(l, "reads fine again")
		}) {
			return errors.New("no info line saying the source reads fine again")
		}
		m, err := a.fetchMetrics(ctx)
		if err != nil {
			return err
		}
		if up := m[`kubenftproxy_source_up{source="api"}`]; up != 1 {
			return fmt.Errorf("source_up %v", up)
		}
		if code, body, err := a.health(ctx, "/readyz"); err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		return nil
	})
}

// goneMetric scrapes one sample of the proxy's /metrics (0 if absent).
func (a *apiEnv) goneMetric(t *testing.T, name string) float64 {
	t.Helper()
	var v float64
	a.proxy.poll(t, 10*time.Second, "/metrics", func(ctx context.Context) error {
		m, err := a.fetchMetrics(ctx)
		v = m[name]
		return err
	})
	return v
}

// waitRuleset polls the node namespace's ruleset until ok.
func (a *apiEnv) waitRuleset(t *testing.T, what string, ok func(string) bool) {
	t.Helper()
	a.proxy.poll(t, 10*time.Second, what, func(ctx context.Context) error {
		rs, err := a.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		if !ok(string(rs)) {
			return errors.New("not yet")
		}
		return nil
	})
}
