package proxy

// The soak (issue "Never stuck, never silent"): the real proxy against a
// real API server for a long while, under steady traffic, churn of
// endpoints and Services, and API server and etcd restarts and a hung
// (SIGSTOPped) API server. `make soak SOAK=30m` runs the long version; a
// short one runs with the other kernel tests.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The soak's targets: a TCP and a UDP Service, each a NodePort too, whose
// endpoints pod-a and pod-b stay valid throughout, so that any failed
// request to them is the proxy's doing. soakPodD joins and leaves
// soak-web's endpoints, make-before-break (pod-a and pod-b stay).
const (
	soakWebName     = "soak-web"
	soakWebIP       = "10.96.2.10"
	soakWebNodePort = 30180
	soakDNSName     = "soak-dns"
	soakDNSIP       = "10.96.2.53"
	soakDNSNodePort = 30153

	soakInterval    = 50 * time.Millisecond  // between two requests of a flow
	soakStep        = 200 * time.Millisecond // between two churn changes
	soakCallTimeout = 3 * time.Second        // of each churn request to the API server
	soakWorkers     = 16                     // creating the initial Services
	// soakAddrBlocks bounds the index given to fakeEndpoints, whose
	// addresses run out past 6,553 Services; a long soak creates more.
	soakAddrBlocks = 6000
	// The leak bounds, end minus start, once the churn has stopped and the
	// kernel holds the final state.
	soakMaxMoreFDs        = 10
	soakMaxMoreGoroutines = 25
)

var soakPodD = sandbox.NewPod("pod-d", 13)

// soakConfig is one soak's size and schedule.
type soakConfig struct {
	duration     time.Duration // of churn and disruptions, under traffic
	services     int           // churned Services, besides the targets
	disruptEvery time.Duration // quiet time before each disruption
	pause        time.Duration // how long the API server stays SIGSTOPped
	sampleEvery  time.Duration // of the proxy's RSS, goroutines, fds, threads
}

// soakConfigFromEnv is the short soak, or the long one for the duration in
// KNP_SOAK (with 1,000 Services, or KNP_SOAK_SERVICES).
func soakConfigFromEnv(t *testing.T) soakConfig {
	t.Helper()
	cfg := soakConfig{duration: time.Minute, services: 200, disruptEvery: 10 * time.Second, pause: 10 * time.Second, sampleEvery: 5 * time.Second}
	if v := os.Getenv("KNP_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			t.Fatalf("KNP_SOAK=%q: want a duration of a minute or more, such as 30m", v)
		}
		cfg = soakConfig{duration: d, services: 1000, disruptEvery: 3 * time.Minute, pause: time.Minute, sampleEvery: 30 * time.Second}
	}
	if v := os.Getenv("KNP_SOAK_SERVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 || n > 5000 {
			t.Fatalf("KNP_SOAK_SERVICES=%q: want 10 to 5000", v)
		}
		cfg.services = n
	}
	return cfg
}

// TestSoak runs the proxy against a real API server with cfg.services
// Services (a tenth of them NodePorts) for cfg.duration, while four flows
// send a request every 50ms each (TCP and UDP, from pod-c to the targets'
// ClusterIPs and from the client to their NodePorts), endpoints and
// Services change five times a second, and the API server is killed and
// restarted, etcd is killed and restarted, and the API server is SIGSTOPped
// for cfg.pause, in turn, every cfg.disruptEvery. It fails on any failed
// request (none is excused, disruptions included: the rules must stay as
// they are while the API server is away), on fds or goroutines growing
// beyond a bound, and unless the kernel ends up with exactly what render
// makes of the API server's objects.
func TestSoak(t *testing.T) {
	t.Parallel()
	cfg := soakConfigFromEnv(t)
	a := newAPIEnv(t, soakPodD)
	a.state = t.TempDir() // where checkSoakState puts the API server's objects
	a.createSoakTargets(t)
	c := newChurner(a)
	c.createInitial(t, cfg.services)
	a.waitSoakTargets(t)
	initial := a.checkSoakState(t, nil, 2*time.Minute, "the initial Services")
	t.Logf("%d Services programmed (the kernel equal to render %v after they were created)", initial.services, initial.took.Round(time.Millisecond))

	flows := a.startSoakFlows(t, cfg.duration+10*time.Minute)
	start, err := a.sampleProxy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s := &sampler{a: a, every: cfg.sampleEvery, t0: time.Now(), logf: t.Logf, max: start}
	d := &disruptor{a: a, every: cfg.disruptEvery, pause: cfg.pause, logf: t.Logf}
	ctx, cancel := context.WithTimeout(t.Context(), cfg.duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { c.run(ctx) })
	wg.Go(func() { d.run(ctx) })
	wg.Go(func() { s.run(ctx) })
	wg.Wait()
	if d.err != nil {
		t.Fatal(d.err)
	}

	final := a.checkSoakState(t, c.deleted, 2*time.Minute, "the final state")
	sums := make([]*echo.Summary, len(flows))
	for i, l := range flows {
		l.stop(t)
		sums[i] = l.wait(t)
	}
	end, err := a.sampleProxy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s.add(end)
	logSoak(t, cfg, flows, sums, c, d, final, start, end, s.max)
	judgeSoak(t, flows, sums, d.done, start, end)
	a.proxy.checkRunning(t)
}

// createSoakTargets creates soak-web (TCP) and soak-dns (UDP), both
// NodePorts, with pod-a and pod-b as their endpoints.
func (a *apiEnv) createSoakTargets(t *testing.T) {
	t.Helper()
	web := apiService(soakWebName, soakWebIP, nil)
	web.Spec.Type = corev1.ServiceTypeNodePort
	web.Spec.Ports[0].NodePort = soakWebNodePort
	dns := apiUDPService(soakDNSName, soakDNSIP)
	dns.Spec.Type = corev1.ServiceTypeNodePort
	dns.Spec.Ports[0].NodePort = soakDNSNodePort
	a.do(t, "POST", servicesPath, web, nil)
	a.do(t, "POST", slicesPath, apiSlice(soakWebName, nil, podA, podB), nil)
	a.do(t, "POST", servicesPath, dns, nil)
	a.do(t, "POST", slicesPath, apiUDPSlice(soakDNSName, podA, podB), nil)
}

// soakTarget is one flow of the soak: from namespace ns to addr.
type soakTarget struct{ ns, proto, addr string }

func soakTargets() []soakTarget {
	node := sandbox.NodeIPv4.Addr().String()
	return []soakTarget{
		{podC.Name, "tcp", hostPort(soakWebIP, webPort)},
		{podC.Name, "udp", hostPort(soakDNSIP, dnsPort)},
		{sandbox.Client, "tcp", hostPort(node, strconv.Itoa(soakWebNodePort))},
		{sandbox.Client, "udp", hostPort(node, strconv.Itoa(soakDNSNodePort))},
	}
}

// waitSoakTargets polls each target until it answers.
func (a *apiEnv) waitSoakTargets(t *testing.T) {
	t.Helper()
	for _, tg := range soakTargets() {
		a.proxy.poll(t, time.Minute, fmt.Sprintf("%s %s from %s to answer", tg.proto, tg.addr, tg.ns), func(ctx context.Context) error {
			_, err := a.client(ctx, tg.ns, tg.proto, tg.addr, 4, "--timeout", "300ms")
			return err
		})
	}
}

// startSoakFlows starts one loop per target, a request every soakInterval,
// each allowed flowTimeout, for at most limit.
func (a *apiEnv) startSoakFlows(t *testing.T, limit time.Duration) []*trafficLoop {
	t.Helper()
	var loops []*trafficLoop
	for _, tg := range soakTargets() {
		loops = append(loops, a.startLoop(t, tg.ns, tg.proto, tg.addr,
			"--duration", limit.String(), "--interval", soakInterval.String(), "--timeout", flowTimeout.String()))
	}
	return loops
}

// soakState is what checkSoakState found.
type soakState struct {
	services int           // in the API server, the "kubernetes" one included
	gone     int           // deleted Services, checked absent from the kernel
	took     time.Duration // until the kernel equalled render
}

// checkSoakState writes the API server's Services, EndpointSlices and
// ServiceCIDRs into the env's state directory and waits until the kernel's
// ruleset equals what render makes of them; then it checks by name that
// each Service of the API server is in the ruleset and that none of
// deleted is, unless it is still in the API server (its DELETE failed).
func (a *apiEnv) checkSoakState(t *testing.T, deleted []string, timeout time.Duration, what string) soakState {
	t.Helper()
	var services, slices, cidrs json.RawMessage
	a.do(t, "GET", "/api/v1/services", nil, &services)
	a.do(t, "GET", "/apis/discovery.k8s.io/v1/endpointslices", nil, &slices)
	a.do(t, "GET", "/apis/networking.k8s.io/v1/servicecidrs", nil, &cidrs)
	writeAtomic(t, a.state, "services.json", string(services))
	writeAtomic(t, a.state, "endpointslices.json", string(slices))
	writeAtomic(t, a.state, "servicecidrs.json", string(cidrs))
	took := a.waitRendered(t, timeout, what)

	var list corev1.ServiceList
	if err := json.Unmarshal(services, &list); err != nil {
		t.Fatal(err)
	}
	ruleset := a.nftRuleset(t)
	exists := map[string]bool{}
	for _, s := range list.Items {
		exists[s.Name] = true
		if strings.HasPrefix(s.Name, "soak-") && !strings.Contains(ruleset, `"default/`+s.Name+`:`) {
			t.Errorf("%s: Service %s is in the API server but not in the kernel", what, s.Name)
		}
	}
	gone := 0
	for _, name := range deleted {
		if exists[name] {
			continue
		}
		gone++
		if strings.Contains(ruleset, `"default/`+name+`:`) {
			t.Errorf("%s: Service %s was deleted but is still in the kernel", what, name)
		}
	}
	return soakState{services: len(list.Items), gone: gone, took: took}
}
