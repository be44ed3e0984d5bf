// Package scale fills a real API server with many Services and their
// EndpointSlices, and changes one of them, for the benchmarks that run
// proxies against it side by side (the IPVS benchmark in the VM, make
// bench-scale). It talks plain HTTPS with a bearer token, so that it also
// runs inside the VM guest without a kubeconfig.
package scale

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	// Namespace holds every object this package creates.
	Namespace = "default"
	// TargetPort is the endpoints' port; the Services listen on 80.
	TargetPort = 8080
	// ServicePort is every Service's port.
	ServicePort = 80

	// ServicesPath and SlicesPath are the API paths of Namespace's
	// Services and EndpointSlices.
	ServicesPath = "/api/v1/namespaces/" + Namespace + "/services"
	SlicesPath   = "/apis/discovery.k8s.io/v1/namespaces/" + Namespace + "/endpointslices"
)

// Client is an API server client for one bearer token.
type Client struct {
	URL   string
	Token string
	http  *http.Client
	// retryUnit is createRetrying's first pause (zero: a second).
	retryUnit time.Duration
}

// NewClient returns a Client for the API server at url (https), trusting
// caPEM. serverName, if not empty, is the name the serving certificate is
// checked against (the VM reaches the host's server at another address).
// Up to conns connections are kept open, for as many concurrent requests.
func NewClient(url, token string, caPEM []byte, serverName string, conns int) (*Client, error) {
	return NewClientDialer(url, token, caPEM, serverName, conns, nil)
}

// NewClientDialer is NewClient with the connections opened by dial (nil:
// the default dialer), e.g. inside the API server's network namespace.
func NewClientDialer(url, token string, caPEM []byte, serverName string, conns int,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("scale: no certificate in the CA PEM")
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: conns,
		ForceAttemptHTTP2:   false,
		Proxy:               nil, // test servers only, whatever HTTPS_PROXY says
		DialContext:         dial,
	}
	return &Client{URL: url, Token: token, http: &http.Client{Timeout: time.Minute, Transport: tr}}, nil
}

// StatusError is a response other than 2xx.
type StatusError struct {
	Method, Path string
	Code         int
	Body         string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Code, e.Body)
}

// Do sends in (JSON, if not nil) and decodes the answer into out (if not nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		if len(data) > 512 {
			data = data[:512]
		}
		return &StatusError{Method: method, Path: path, Code: resp.StatusCode, Body: string(data)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}

// Ready waits until the server answers /readyz, polling until ctx ends.
func (c *Client) Ready(ctx context.Context) error {
	for {
		err := c.Do(ctx, http.MethodGet, "/readyz", nil, nil)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server at %s not ready: %w", c.URL, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Name is the name of Service i (and, with a suffix, of its slice).
func Name(i int) string { return fmt.Sprintf("scale-%05d", i) }

func ptr[T any](v T) *T { return &v }

// Service is Service i: a single-stack IPv4 ClusterIP Service, or a
// NodePort one when nodePort is set.
func Service(i int, nodePort bool) *corev1.Service {
	return ServiceNamed(Name(i), nodePort)
}

// ServiceNamed is Service with another name.
func ServiceNamed(name string, nodePort bool) *corev1.Service {
	typ := corev1.ServiceTypeClusterIP
	if nodePort {
		typ = corev1.ServiceTypeNodePort
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: corev1.ServiceSpec{
			Type:           typ,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy: ptr(corev1.IPFamilyPolicySingleStack),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: ServicePort, TargetPort: intstr.FromInt32(TargetPort),
			}},
		},
	}
}

// endpointBase is where the endpoints' addresses start: 100.64.0.0/10,
// room for 4M endpoints, outside any pod or Service range the tests use.
// Nothing answers on them.
var endpointBase = netip.MustParseAddr("100.64.0.0")

// EndpointAddr is the address of endpoint j of Service i.
func EndpointAddr(i, j, perService int) netip.Addr {
	return addr4Plus(endpointBase, uint32(i*perService+j))
}

// addr4Plus is the IPv4 address n after a.
func addr4Plus(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Slice is the EndpointSlice of Service i with perService ready endpoints
// on node.
func Slice(i, perService int, node string) *discoveryv1.EndpointSlice {
	addrs := make([]netip.Addr, perService)
	for j := range addrs {
		addrs[j] = EndpointAddr(i, j, perService)
	}
	return SliceOf(Name(i), addrs, node)
}

// SliceOf is the EndpointSlice "<service>-ipv4" of Service service with a
// ready endpoint on node at each of addrs.
func SliceOf(service string, addrs []netip.Addr, node string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: service + "-ipv4", Namespace: Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   "kube-nftproxy-scale",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(TargetPort)),
		}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(node),
		})
	}
	return es
}

// Spec says what Populate creates.
type Spec struct {
	From, To   int    // Services [From, To)
	PerService int    // endpoints per Service
	Node       string // the endpoints' nodeName
	// NodePortEvery makes every NodePortEvery-th Service a NodePort one
	// (0: none).
	NodePortEvery int
	Workers       int // concurrent requests (default 16)
	// ClusterIPs, when set, is the Service range: Service i asks for its
	// address 256+i (StaticClusterIP), which the API server grants about
	// twice as fast as one it must pick at random in a filling range.
	ClusterIPs netip.Prefix
}

// Populate creates the Services of spec and their slices, each slice
// right after its Service, with spec.Workers requests in flight. It
// returns at the first error that survives createRetrying's retries.
func Populate(ctx context.Context, c *Client, spec Spec) error {
	return forEach(ctx, spec.From, spec.To, spec.Workers, func(ctx context.Context, i int) error {
		nodePort := spec.NodePortEvery > 0 && i%spec.NodePortEvery == 0
		if err := createService(ctx, c, Service(i, nodePort), StaticClusterIP(spec.ClusterIPs, i)); err != nil {
			return fmt.Errorf("creating Service %d: %w", i, err)
		}
		if err := createRetrying(ctx, c, SlicesPath, Slice(i, spec.PerService, spec.Node)); err != nil {
			return fmt.Errorf("creating Service %d's slice: %w", i, err)
		}
		return nil
	})
}

// StaticClusterIP is the address Populate asks for Service i in the
// Service range prefix: its 256+i-th, after the low addresses that the API
// server's own Services take; invalid when prefix is (the API server picks).
func StaticClusterIP(prefix netip.Prefix, i int) netip.Addr {
	if !prefix.IsValid() || !prefix.Addr().Is4() {
		return netip.Addr{}
	}
	a := addr4Plus(prefix.Masked().Addr(), 256+uint32(i))
	if !prefix.Contains(a) {
		return netip.Addr{}
	}
	return a
}

// createService creates svc asking for the address ip when it is valid;
// if a Service created without one took ip already, the API server picks.
func createService(ctx context.Context, c *Client, svc *corev1.Service, ip netip.Addr) error {
	if ip.IsValid() {
		asked := *svc
		asked.Spec.ClusterIP, asked.Spec.ClusterIPs = ip.String(), []string{ip.String()}
		err := createRetrying(ctx, c, ServicesPath, &asked)
		var status *StatusError
		if !errors.As(err, &status) || status.Code != http.StatusUnprocessableEntity || !strings.Contains(status.Body, "already allocated") {
			return err
		}
		// An overloaded server may have created it while answering
		// otherwise: then the name is taken too.
		err = createRetrying(ctx, c, ServicesPath, svc)
		if errors.As(err, &status) && status.Code == http.StatusConflict {
			return nil
		}
		return err
	}
	return createRetrying(ctx, c, ServicesPath, svc)
}

// overloaded reports whether an answer says the server or its etcd could
// not keep up (a Service's IP allocation that timed out in etcd comes back
// as 422 Invalid).
func overloaded(status *StatusError) bool {
	return status.Code == http.StatusTooManyRequests || status.Code >= 500 ||
		strings.Contains(status.Body, "etcdserver: request timed out")
}

// createRetrying POSTs obj, trying again after an answer that says the
// server is overloaded or its etcd timed out (a fill of 50k Services on a
// busy machine met "etcdserver: request timed out"). Such a request may
// have been carried out all the same, so AlreadyExists on a retry is
// success.
func createRetrying(ctx context.Context, c *Client, path string, obj any) error {
	const attempts = 6
	for attempt := 1; ; attempt++ {
		err := c.Do(ctx, http.MethodPost, path, obj, nil)
		var status *StatusError
		if !errors.As(err, &status) {
			return err
		}
		if status.Code == http.StatusConflict && attempt > 1 {
			return nil
		}
		if attempt == attempts || !overloaded(status) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * cmp.Or(c.retryUnit, time.Second)):
		}
	}
}

// forEach calls fn for every i in [from, to) with workers calls in flight
// (default 16), and returns the first error, after which it starts no
// more.
func forEach(ctx context.Context, from, to, workers int, fn func(ctx context.Context, i int) error) error {
	if workers <= 0 {
		workers = 16
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	next.Store(int64(from))
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// ClusterIP returns Service i's ClusterIP.
func ClusterIP(ctx context.Context, c *Client, i int) (netip.Addr, error) {
	var svc corev1.Service
	if err := c.Do(ctx, http.MethodGet, ServicesPath+"/"+Name(i), nil, &svc); err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(svc.Spec.ClusterIP)
}

// CreateService creates svc and returns its ClusterIP.
func CreateService(ctx context.Context, c *Client, svc *corev1.Service) (netip.Addr, error) {
	var created corev1.Service
	if err := c.Do(ctx, http.MethodPost, ServicesPath, svc, &created); err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(created.Spec.ClusterIP)
}

// CreateSlice creates es.
func CreateSlice(ctx context.Context, c *Client, es *discoveryv1.EndpointSlice) error {
	return c.Do(ctx, http.MethodPost, SlicesPath, es, nil)
}

// DeleteService deletes Service name and its slice "<name>-ipv4"; either
// being absent already is no error.
func DeleteService(ctx context.Context, c *Client, name string) error {
	for _, path := range []string{ServicesPath + "/" + name, SlicesPath + "/" + name + "-ipv4"} {
		err := c.Do(ctx, http.MethodDelete, path, nil, nil)
		var se *StatusError
		if err != nil && !(errors.As(err, &se) && se.Code == http.StatusNotFound) {
			return err
		}
	}
	return nil
}

// SetEndpoint makes endpoint j of Service i's slice addr, and returns the
// address it had.
func SetEndpoint(ctx context.Context, c *Client, i, j int, addr netip.Addr) (netip.Addr, error) {
	return SetEndpointOf(ctx, c, Name(i), j, addr)
}

// SetEndpointOf is SetEndpoint for the slice of Service service.
func SetEndpointOf(ctx context.Context, c *Client, service string, j int, addr netip.Addr) (netip.Addr, error) {
	path := SlicesPath + "/" + service + "-ipv4"
	var es discoveryv1.EndpointSlice
	if err := c.Do(ctx, http.MethodGet, path, nil, &es); err != nil {
		return netip.Addr{}, err
	}
	if j >= len(es.Endpoints) || len(es.Endpoints[j].Addresses) == 0 {
		return netip.Addr{}, fmt.Errorf("%s has no endpoint %d", path, j)
	}
	old, err := netip.ParseAddr(es.Endpoints[j].Addresses[0])
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s: %w", path, err)
	}
	es.Endpoints[j].Addresses = []string{addr.String()}
	if err := c.Do(ctx, http.MethodPut, path, &es, nil); err != nil {
		return netip.Addr{}, err
	}
	return old, nil
}

// Node creates (or keeps) the Node object a proxy reads its addresses from.
func Node(ctx context.Context, c *Client, name string, addr netip.Addr) error {
	n := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: addr.String()},
			{Type: corev1.NodeHostName, Address: name},
		}},
	}
	err := c.Do(ctx, http.MethodPost, "/api/v1/nodes", n, nil)
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict {
		return nil
	}
	return err
}

// Depopulate deletes the Services [from, to) and their slices, with
// workers requests in flight (default 16).
func Depopulate(ctx context.Context, c *Client, from, to, workers int) error {
	return forEach(ctx, from, to, workers, func(ctx context.Context, i int) error {
		return DeleteService(ctx, c, Name(i))
	})
}
