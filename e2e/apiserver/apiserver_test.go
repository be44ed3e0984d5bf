package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestPKI checks the generated certificates without any binary.
func TestPKI(t *testing.T) {
	p, err := writePKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p.caPEM) {
		t.Fatal("CA PEM does not parse")
	}
	pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"127.0.0.1", "localhost", "kubernetes.default.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("verify %s: %v", name, err)
		}
	}
	for _, f := range []string{p.saKeyFile, p.saPubFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if blk, _ := pem.Decode(b); blk == nil {
			t.Errorf("%s: no PEM block", f)
		}
	}
}

// TestServiceAndEndpointSliceSurviveRestart runs the real kube-apiserver:
// it creates a dual-stack Service and an EndpointSlice, reads them back,
// kills and restarts the API server, and reads them again.
func TestServiceAndEndpointSliceSurviveRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	t0 := time.Now()
	s, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready at %s after %v (dir %s)", s.URL, time.Since(t0).Round(time.Millisecond), s.Dir)
	if host, _, _ := net.SplitHostPort(s.Host); host != "127.0.0.1" {
		t.Fatalf("Host = %q, want 127.0.0.1:<port>", s.Host)
	}
	kc, err := os.ReadFile(s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(kc), "server: "+s.URL) || !strings.Contains(string(kc), "token: "+s.Token) {
		t.Errorf("kubeconfig does not name the server and token:\n%s", kc)
	}

	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr(corev1.IPFamilyPolicyRequireDualStack),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	var created corev1.Service
	if err := s.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/services", svc, &created); err != nil {
		t.Fatal(err)
	}
	t.Logf("Service default/web: clusterIPs %v", created.Spec.ClusterIPs)
	if len(created.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs = %v, want one IPv4 and one IPv6", created.Spec.ClusterIPs)
	}
	_, v4, _ := net.ParseCIDR("10.96.0.0/16")
	_, v6, _ := net.ParseCIDR("fd00:10:96::/112")
	if !v4.Contains(net.ParseIP(created.Spec.ClusterIPs[0])) || !v6.Contains(net.ParseIP(created.Spec.ClusterIPs[1])) {
		t.Errorf("clusterIPs %v not in %s and %s", created.Spec.ClusterIPs, v4, v6)
	}

	slice := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-ipv4", Namespace: "default",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: "web",
				discoveryv1.LabelManagedBy:   "kube-nftproxy-e2e",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.244.0.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr("node-1"),
		}},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080)),
		}},
	}
	var createdSlice discoveryv1.EndpointSlice
	if err := s.Do(ctx, http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", slice, &createdSlice); err != nil {
		t.Fatal(err)
	}

	check := func(when string) {
		t.Helper()
		var gotSvc corev1.Service
		if err := s.Do(ctx, http.MethodGet, "/api/v1/namespaces/default/services/web", nil, &gotSvc); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if gotSvc.UID != created.UID || strings.Join(gotSvc.Spec.ClusterIPs, ",") != strings.Join(created.Spec.ClusterIPs, ",") ||
			len(gotSvc.Spec.Ports) != 1 || gotSvc.Spec.Ports[0].TargetPort.IntValue() != 8080 {
			t.Errorf("%s: Service = uid %s clusterIPs %v ports %+v, want uid %s clusterIPs %v targetPort 8080",
				when, gotSvc.UID, gotSvc.Spec.ClusterIPs, gotSvc.Spec.Ports, created.UID, created.Spec.ClusterIPs)
		}
		var gotSlice discoveryv1.EndpointSlice
		if err := s.Do(ctx, http.MethodGet, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-ipv4", nil, &gotSlice); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if gotSlice.UID != createdSlice.UID || gotSlice.Labels[discoveryv1.LabelServiceName] != "web" ||
			len(gotSlice.Endpoints) != 1 || len(gotSlice.Endpoints[0].Addresses) != 1 ||
			gotSlice.Endpoints[0].Addresses[0] != "10.244.0.10" || len(gotSlice.Ports) != 1 || *gotSlice.Ports[0].Port != 8080 {
			t.Errorf("%s: EndpointSlice = %+v", when, gotSlice)
		}
		// Selecting by the label kube-proxy watches finds it.
		var list discoveryv1.EndpointSliceList
		if err := s.Do(ctx, http.MethodGet, "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb", nil, &list); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != "web-ipv4" {
			t.Errorf("%s: list by service-name label = %d items", when, len(list.Items))
		}
	}
	check("before restart")

	// The kube-proxy identity can read Services and EndpointSlices but not
	// write them (ClusterRole system:node-proxier).
	proxyGet := func(path string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+s.ProxyToken)
		resp, err := s.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := proxyGet("/apis/discovery.k8s.io/v1/endpointslices"); c != http.StatusOK {
		t.Errorf("kube-proxy token: list endpointslices = %d, want 200", c)
	}
	if c := proxyGet("/api/v1/secrets"); c != http.StatusForbidden {
		t.Errorf("kube-proxy token: list secrets = %d, want 403", c)
	}

	// Kill the API server: requests fail; start it again on the same URL.
	url := s.URL
	if err := s.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	if s.APIServerRunning() {
		t.Fatal("APIServerRunning after KillAPIServer")
	}
	err = s.Do(ctx, http.MethodGet, "/api/v1/namespaces/default/services/web", nil, nil)
	var se *StatusError
	if err == nil || errors.As(err, &se) {
		t.Fatalf("request with kube-apiserver killed: err = %v, want a connection error", err)
	}
	t0 = time.Now()
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver back after %v", time.Since(t0).Round(time.Millisecond))
	if s.URL != url {
		t.Fatalf("URL changed across restart: %s -> %s", url, s.URL)
	}
	check("after restart")

	// RestartAPIServer does both in one call.
	if err := s.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	check("after second restart")
}

func ptr[T any](v T) *T { return &v }
