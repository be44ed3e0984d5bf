package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Sizes of the scale fault scenarios: lean (two endpoints per Service) so
// that they run in make test, big enough that a full sync takes a while.
const (
	killSyncServices = 5_000  // the first sync that kill -9 interrupts
	fullSyncServices = 10_000 // the full sync under traffic
	churnRounds      = 10     // rounds of endpoint changes ...
	churnPerRound    = 50     // ... to this many Services of loadServiceCount, two endpoints each: 1,000 changes
)

// ruleSampler checks over and over, until stopped, that the good Service's
// rules are in the node's kernel: the web Service's KUBE-SVC chain (in the
// main or the delta table) going to both of its endpoints.
type ruleSampler struct {
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	samples int
	misses  []string // what was wrong, with the time
}

func (e *env) sampleRules(t *testing.T) *ruleSampler {
	t.Helper()
	svc := svcChain(webSPN, "tcp")
	var seps []string
	for _, p := range []sandbox.Pod{podA, podB} {
		seps = append(seps, "goto "+sepChain(webSPN, "tcp", netip.AddrPortFrom(p.IPv4, podTCPPort)))
	}
	s := &ruleSampler{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stopCh:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var problem string
			found := false
			for _, table := range []string{"kube-nftproxy", "kube-nftproxy-delta"} {
				out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "chain", "ip", table, svc)
				if err != nil {
					continue
				}
				found = true
				for _, g := range seps {
					if !strings.Contains(string(out), g) {
						problem = fmt.Sprintf("chain %s of table ip %s has no %q", svc, table, g)
					}
				}
				break
			}
			cancel()
			if !found {
				problem = fmt.Sprintf("no chain %s in ip kube-nftproxy or ip kube-nftproxy-delta", svc)
			}
			s.mu.Lock()
			s.samples++
			if problem != "" {
				s.misses = append(s.misses, time.Now().UTC().Format("15:04:05.000")+" "+problem)
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { s.stop() })
	return s
}

// stop ends the sampling and returns how many samples were taken and what
// the failed ones saw.
func (s *ruleSampler) stop() (samples int, misses []string) {
	select {
	case <-s.stopCh:
	default:
		close(s.stopCh)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.misses
}

// expectAlways fails the test unless every sample found the rules.
func (s *ruleSampler) expectAlways(t *testing.T, what string) {
	t.Helper()
	n, misses := s.stop()
	t.Logf("%s: %d samples of the good Service's rules, %d without them", what, n, len(misses))
	if len(misses) > 0 {
		t.Errorf("%s: %d of %d samples found the good Service's rules missing; first: %q", what, len(misses), n, firstN(misses, 3))
	}
	if n < 5 {
		t.Errorf("%s: only %d samples of the rules: that proves little", what, n)
	}
}

// waitFullSync waits until the proxy logs a full sync of at least n
// Services and returns how long after since that was seen.
func (p *proxy) waitFullSync(t *testing.T, since time.Time, timeout time.Duration, n int) time.Duration {
	t.Helper()
	p.waitLog(t, timeout, fmt.Sprintf("a full sync of %d+ Services", n), func(lines []string) bool {
		for _, l := range lines {
			if isSyncedLine(l) && strings.Contains(l, "full=true") && logInt(l, "services") >= n {
				return true
			}
		}
		return false
	})
	return time.Since(since)
}

// TestFaultKillDuringFirstSync kills the proxy (SIGKILL) in the middle of
// its first sync of 5,000 more Services, with the good Service's rules in
// the kernel from its previous run, and starts it again: at no moment may
// the good Service's rules be missing or its traffic fail, and the
// restarted proxy must converge on the whole state.
func TestFaultKillDuringFirstSync(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	e.proxy.stop(t)
	writeAtomic(t, e.state, "load-services.yaml", loadServices(killSyncServices))
	writeAtomic(t, e.state, "load-endpointslices.yaml", loadSlices(killSyncServices, loadPortBase))

	f := e.startExampleFlows(t)
	rules := e.sampleRules(t)

	// Killed once it has read the state and starts its first sync (it
	// logs "running" right before): at once, and a little later, to land
	// in the building of the rules and in the kernel transaction.
	for _, after := range []time.Duration{0, 200 * time.Millisecond} {
		e.proxy = launchProxy(t, e.sb, 10*time.Second, proxyCommand(e.state)...)
		e.proxy.waitLog(t, time.Minute, "the proxy to start its first sync", func(lines []string) bool {
			return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "kube-nftproxy running") })
		})
		if after > 0 {
			time.Sleep(after) // placing the fault, not waiting for anything
		}
		e.proxy.kill(t)
		if n := e.proxy.syncs(); n > 0 {
			t.Logf("kill -9 %v after the first sync started: it had finished already (%d syncs logged)", after, n)
		} else {
			t.Logf("kill -9 %v after the first sync started: before it was logged as done", after)
		}
	}

	t0 := time.Now()
	e.proxy = launchProxy(t, e.sb, 10*time.Second, proxyCommand(e.state)...)
	took := e.proxy.waitFullSync(t, t0, time.Minute, killSyncServices)
	e.expectLoadPorts(t, map[int]int{loadPortBase: killSyncServices})
	rules.expectAlways(t, "kill -9 during the first sync and restart")
	res := f.stop(t)
	logFault(t, fmt.Sprintf("kill -9 during the first sync of %d Services, restart", killSyncServices), took, res)
	res.expectNoFailures(t, "kill -9 during the first sync and restart")
}

// TestFaultEndpointChurn applies 1,000 endpoint changes to 1,000 other
// Services, in rounds of 50 Services (each round one sync; the delta table
// grows past its fold threshold along the way), while the good Service
// carries traffic: not one connection to it may fail.
func TestFaultEndpointChurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{
		"load-services.yaml":       loadServices(loadServiceCount),
		"load-endpointslices.yaml": loadSlices(loadServiceCount, loadPortBase),
	}})
	e.expectLoadPort(t, loadPortBase)
	f := e.startExampleFlows(t)
	rules := e.sampleRules(t)
	t0 := time.Now()
	changed := 0 // Services [0, changed) are on loadPortBase+1
	for round := range churnRounds {
		changed += churnPerRound
		before := e.proxy.syncs()
		writeAtomic(t, e.state, "load-endpointslices.yaml", loadSlicesPorts(loadServiceCount, func(i int) int {
			if i < changed {
				return loadPortBase + 1
			}
			return loadPortBase
		}))
		e.proxy.waitLog(t, 30*time.Second, fmt.Sprintf("the sync of round %d", round), func(lines []string) bool {
			return countSyncs(lines) > before
		})
	}
	took := time.Since(t0)
	e.proxy.poll(t, 10*time.Second, "all the changes in the kernel", func(ctx context.Context) error {
		out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			return err
		}
		if d := loadPortsDiff(string(out), map[int]int{loadPortBase + 1: changed, loadPortBase: loadServiceCount - changed}); d != "" {
			return fmt.Errorf("%s", d)
		}
		return nil
	})
	rules.expectAlways(t, "endpoint churn")
	res := f.stop(t)
	logFault(t, fmt.Sprintf("%d endpoint changes to other Services in %d syncs", 2*changed, churnRounds), took, res)
	res.expectNoFailures(t, "endpoint churn")
	e.proxy.checkRunning(t)
}

// TestFaultFullSyncUnderTraffic restarts the proxy, with the good
// Service's rules in place, on a state of 10,000 more Services, so that its
// first sync writes all of them in one full sync: the good Service's
// traffic must not fail, and its rules must be there throughout.
func TestFaultFullSyncUnderTraffic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	f := e.startExampleFlows(t)
	rules := e.sampleRules(t)

	e.proxy.stop(t)
	writeAtomic(t, e.state, "load-services.yaml", loadServices(fullSyncServices))
	writeAtomic(t, e.state, "load-endpointslices.yaml", loadSlices(fullSyncServices, loadPortBase))
	t0 := time.Now()
	e.proxy = launchProxy(t, e.sb, 10*time.Second, proxyCommand(e.state)...)
	// Reading 10,000 Services from YAML is slow (35 s on this machine
	// now, quadratic in the file's documents): a generous deadline.
	took := e.proxy.waitFullSync(t, t0, 3*time.Minute, fullSyncServices)
	e.expectLoadPorts(t, map[int]int{loadPortBase: fullSyncServices})
	rules.expectAlways(t, "full sync of 10k Services")
	res := f.stop(t)
	logFault(t, fmt.Sprintf("restart: full sync of %d Services under traffic", fullSyncServices), took, res)
	for _, l := range e.proxy.log.lines() {
		if isSyncedLine(l) {
			t.Logf("sync: %s", l)
		}
	}
	res.expectNoFailures(t, "full sync of 10k Services")
	e.proxy.checkRunning(t)
}
