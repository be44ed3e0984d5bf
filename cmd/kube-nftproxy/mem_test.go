package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/scale"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/source/apisource"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// TestProxyMemory is the proxy's memory at scale without an API server:
// KNP_MEM_SERVICES Services x 10 endpoints, shaped as the API server hands
// them out to the scale benchmark (e2e/nftbench), go through the informers,
// the Builder and one full nft sync into a network namespace of its own.
// It logs the live heap after each stage and the process's peak RSS
// (VmHWM), and writes heap profiles to KNP_MEM_PROFILES if set. One size
// per process: the peak RSS of a smaller size would hide under a larger's.
// With KNP_MEM_KERNEL=0 it stops at building the Ruleset (no namespace).
// The backend has the proxy's large-transaction guard (largeTxMemory)
// unless KNP_MEM_LARGETX=0.
func TestProxyMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KNP_MEM_SERVICES"))
	if n == 0 {
		t.Skip("set KNP_MEM_SERVICES (e.g. 10000) to measure the proxy's memory at that size")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and nftables")
	}
	profiles := os.Getenv("KNP_MEM_PROFILES")
	const perService, node = 10, "node-1"
	client := memClient(n, perService, node)
	cfg := nft.DefaultConfig()
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	var be *nft.Backend
	if os.Getenv("KNP_MEM_KERNEL") != "0" {
		ns := testns.New(t, "knp-mem-")
		k, err := nftlib.OpenKernel(testns.Path(ns))
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		// As the proxy runs it (KNP_MEM_LARGETX=0: without the guard).
		// Each round of the transaction's rules logged as it is let go.
		bc := nft.BackendConfig{Rules: cfg, Strategy: nft.Strategy{OnLargeTx: largeTxMemory, OnLargeTxRound: func() {
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			t.Logf("%-22s heap in use %6.1f MiB  RSS %6.1f MiB  peak RSS %6.1f MiB", "  a round encoded", mib(ms.HeapInuse), statusMiB(t, "VmRSS:"), peakRSS(t))
		}}}
		if os.Getenv("KNP_MEM_LARGETX") == "0" {
			bc.Strategy = nft.Strategy{}
		}
		if be, err = nft.NewBackend(k, bc); err != nil {
			t.Fatal(err)
		}
	}

	// The heap's high-water marks between stages, sampled: the live heap
	// at the last GC (what sets the next goal), the goal, and the objects
	// (live and garbage).
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	var mu sync.Mutex
	peaks := make([]uint64, len(samples))
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.Context().Done():
				return
			case <-tick.C:
			}
			metrics.Read(samples)
			mu.Lock()
			for i, s := range samples {
				peaks[i] = max(peaks[i], s.Value.Uint64())
			}
			mu.Unlock()
		}
	}()
	stage := func(name string) {
		mu.Lock()
		t.Logf("%-22s max live at a GC %6.1f MiB  max goal %6.1f MiB  max objects %6.1f MiB", "  until "+name, mib(peaks[0]), mib(peaks[1]), mib(peaks[2]))
		clear(peaks)
		mu.Unlock()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("%-22s heap in use %6.1f MiB  heap sys %6.1f MiB  sys %6.1f MiB  peak RSS %6.1f MiB",
			name, mib(ms.HeapInuse), mib(ms.HeapSys), mib(ms.Sys), peakRSS(t))
		if profiles != "" {
			writeHeapProfile(t, filepath.Join(profiles, fmt.Sprintf("heap-%d-%s.pprof", n, name)))
		}
	}
	stage("start")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b := kube.NewBuilder(node)
	ready := make(chan struct{})
	src := &apisource.APISource{Client: client, Builder: b, OnReady: func() { close(ready) }}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("API source stopped: %v", err)
	case <-time.After(5 * time.Minute):
		t.Fatal("caches did not fill")
	}
	stage("informers")
	st := b.State()
	if st.Services.Len() != n {
		t.Fatalf("state has %d service ports, want %d", st.Services.Len(), n)
	}
	stage("state")
	if os.Getenv("KNP_MEM_KERNEL") == "0" {
		// The kernel's own memory for 50k Services x 10 endpoints (many
		// GiB of slab) is more than a shared test machine can spare: the
		// Ruleset the backend would keep, without the transaction.
		rs := nft.Build(st, cfg)
		stage("ruleset")
		runtime.KeepAlive(rs)
		cancel()
		<-done
		return
	}
	t0 := time.Now()
	res, err := be.Sync(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full sync: %v, %d messages, %.1f MiB", time.Since(t0).Round(time.Millisecond), res.Messages, mib(uint64(res.Bytes)))
	stage("full-sync")
	// A second sync of the same state: the steady state between changes.
	if _, err := be.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	stage("second-sync")
	cancel()
	<-done
	runtime.KeepAlive(b)
	runtime.KeepAlive(be)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// peakRSS is VmHWM of this process in MiB.
func peakRSS(t *testing.T) float64 { return statusMiB(t, "VmHWM:") }

// statusMiB is a size in /proc/self/status (key with its colon), in MiB.
func statusMiB(t *testing.T, key string) float64 { return statusMiBOf(t, "self", key) }

// statusMiBOf is a size in the /proc/<pid>/status of process pid ("self",
// or a number).
func statusMiBOf(t *testing.T, pid any, key string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%v/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, key); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	t.Fatalf("no %s in /proc/%v/status", key, pid)
	return 0
}

func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

// apiService is scale.Service as the API server returns it: with the
// fields it defaults and the managedFields of the client that created it.
func apiService(i int, created metav1.Time) *corev1.Service {
	svc := scale.Service(i, i%10 == 0)
	svc.TypeMeta = metav1.TypeMeta{}
	ip := netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)}).String()
	serverMeta(&svc.ObjectMeta, i, created, "v1", `{"f:spec":{"f:internalTrafficPolicy":{},"f:ipFamilies":{},"f:ipFamilyPolicy":{},`+
		`"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},`+
		`"f:sessionAffinity":{},"f:type":{}}}`)
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	svc.Spec.InternalTrafficPolicy = &cluster
	if svc.Spec.Type == corev1.ServiceTypeNodePort {
		svc.Spec.Ports[0].NodePort = int32(30000 + i/10)
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	return svc
}

// apiSlice is scale.Slice as the API server returns it.
func apiSlice(i, perService int, node string, created metav1.Time) *discoveryv1.EndpointSlice {
	es := scale.Slice(i, perService, node)
	es.TypeMeta = metav1.TypeMeta{}
	serverMeta(&es.ObjectMeta, i, created, "discovery.k8s.io/v1", `{"f:addressType":{},"f:endpoints":{},`+
		`"f:metadata":{"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}}},"f:ports":{}}`)
	return es
}

func serverMeta(m *metav1.ObjectMeta, i int, created metav1.Time, apiVersion, fields string) {
	m.UID = types.UID(fmt.Sprintf("6f1c%04x-1b2a-4c3d-9e8f-%012x", i&0xffff, i))
	m.ResourceVersion = strconv.Itoa(1000 + 2*i)
	m.CreationTimestamp = created
	m.Generation = 1
	m.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: "nftbench.test", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: apiVersion,
		Time: &created, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields),
	}}
}

// memClient is a fake clientset whose lists are built when asked for,
// as an API server's response is decoded (the fake's tracker would hold a
// second copy).
func memClient(n, perService int, node string) *fake.Clientset {
	created := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	client := fake.NewClientset()
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
		for i := range n {
			l.Items = append(l.Items, *apiService(i, created))
		}
		return true, l, nil
	})
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
		for i := range n {
			l.Items = append(l.Items, *apiSlice(i, perService, node, created))
		}
		return true, l, nil
	})
	return client
}
