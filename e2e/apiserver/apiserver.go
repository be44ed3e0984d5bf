// Package apiserver runs a real kube-apiserver and etcd on 127.0.0.1 for
// tests.
//
// The kube-apiserver binary is built from the k8s.io/kubernetes Go module by
// hack/apiserver/build.sh and cached under
// ${KNP_CACHE:-/var/cache/kube-nftproxy}/k8s-<version>/bin/; etcd is
// Debian's etcd-server (/usr/bin/etcd). When either is missing, Start skips
// the test with a message saying how to get it (or fails it when
// KNP_REQUIRE_APISERVER=1, which CI sets so that a missing build cannot pass
// as a skip).
//
// Each Server has its own temporary directory with generated certificates
// (crypto/x509), a static token file, a kubeconfig and the two processes'
// logs; etcd and kube-apiserver listen on free ports of 127.0.0.1 only.
// KillAPIServer, StartAPIServer and RestartAPIServer stop and start
// kube-apiserver alone, on the same port with the same certificates and
// tokens, keeping etcd and its data, so clients can reconnect to the same
// URL.
package apiserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultVersion is the Kubernetes version hack/apiserver/build.sh builds.
const DefaultVersion = "v1.37.1"

const (
	// DefaultServiceCIDR is the dual-stack Service range the server is
	// started with, matching e2e/TOPOLOGY.md.
	DefaultServiceCIDR = "10.96.0.0/16,fd00:10:96::/112"

	defaultKubernetesServiceIP = "10.96.0.1"
	defaultReadyTimeout        = 3 * time.Minute
)

// ErrUnavailable is wrapped by the error Start returns (without a testing.TB)
// when the kube-apiserver binary or etcd is not installed.
var ErrUnavailable = errors.New("kube-apiserver harness unavailable")

// Options tune StartWithOptions. The zero value is what Start uses.
type Options struct {
	// ServiceCIDR is --service-cluster-ip-range; default DefaultServiceCIDR.
	ServiceCIDR string
	// ExtraArgs are appended to kube-apiserver's flags (a later flag wins).
	ExtraArgs []string
	// ReadyTimeout bounds each wait for /readyz (at start and restart),
	// unless the context's deadline is sooner; default 3 minutes.
	ReadyTimeout time.Duration
	// NetNS, if set, is a named network namespace (/run/netns/NetNS) to run
	// etcd and kube-apiserver in (via `ip netns exec`): they listen on
	// 127.0.0.1 of that namespace, and HTTPClient, Do and the harness's own
	// checks dial inside it. Its loopback must be up. Empty: the test's
	// own namespace.
	NetNS string
}

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	// URL is the API server's address, https://127.0.0.1:<port>.
	URL string
	// Host is 127.0.0.1:<port>.
	Host string
	// Token is a bearer token for user "admin" in group system:masters.
	Token string
	// ProxyToken is a bearer token for user "system:kube-proxy", which the
	// default RBAC policy binds to ClusterRole system:node-proxier: the
	// permissions a real kube-proxy has.
	ProxyToken string
	// CAFile is the PEM CA that signed the serving certificate; CAPEM is
	// its content.
	CAFile string
	CAPEM  []byte
	// Kubeconfig is a kubeconfig file for Token (context "admin");
	// ProxyKubeconfig is one for ProxyToken (context "kube-proxy"). Both
	// embed the CA.
	Kubeconfig      string
	ProxyKubeconfig string
	// EtcdURL is etcd's client URL, http://127.0.0.1:<port>.
	EtcdURL string
	// Dir holds the certificates, token file, kubeconfigs, etcd data and
	// the logs (etcd.log, kube-apiserver.log). Stop removes it.
	Dir string

	opts      Options
	apiArgv   []string
	etcdArgv  []string
	apiLog    string
	etcdLog   string
	client    *http.Client
	mu        sync.Mutex
	etcd, api *proc
	stopped   bool
}

// BinaryPath is where the harness looks for kube-apiserver: $KNP_KUBE_APISERVER
// if set, else hack/apiserver/build.sh's cache path
// ${KNP_CACHE:-/var/cache/kube-nftproxy}/k8s-${KNP_K8S_VERSION:-DefaultVersion}/bin/kube-apiserver.
func BinaryPath() string {
	if p := os.Getenv("KNP_KUBE_APISERVER"); p != "" {
		return p
	}
	return cachedBin("kube-apiserver")
}

// KubectlPath is where tests find kubectl (e2e/deploy renders deploy/'s
// kustomizations with it): $KNP_KUBECTL if set, else hack/cluster/build.sh's
// cache path beside kube-apiserver's, .../bin/kubectl.
func KubectlPath() string {
	if p := os.Getenv("KNP_KUBECTL"); p != "" {
		return p
	}
	return cachedBin("kubectl")
}

// KubeProxyPath is where tests find upstream kube-proxy, run beside ours:
// $KNP_KUBE_PROXY if set, else hack/kube-proxy/build.sh's cache path
// beside kube-apiserver's, .../bin/kube-proxy.
func KubeProxyPath() string {
	if p := os.Getenv("KNP_KUBE_PROXY"); p != "" {
		return p
	}
	return cachedBin("kube-proxy")
}

// cachedBin is a Kubernetes binary in hack/cluster/build.sh's cache:
// ${KNP_CACHE:-/var/cache/kube-nftproxy}/k8s-${KNP_K8S_VERSION:-DefaultVersion}/bin/name.
func cachedBin(name string) string {
	root := os.Getenv("KNP_CACHE")
	if root == "" {
		root = "/var/cache/kube-nftproxy"
	}
	v := os.Getenv("KNP_K8S_VERSION")
	if v == "" {
		v = DefaultVersion
	}
	return filepath.Join(root, "k8s-"+v, "bin", name)
}

// EtcdPath is where the harness looks for etcd: $KNP_ETCD if set, else etcd
// in PATH, else /usr/bin/etcd.
func EtcdPath() string {
	if p := os.Getenv("KNP_ETCD"); p != "" {
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	return "/usr/bin/etcd"
}

// Available returns nil when both binaries are installed, else an error
// wrapping ErrUnavailable that says how to install what is missing.
func Available() error {
	var missing []string
	if !executable(BinaryPath()) {
		missing = append(missing, fmt.Sprintf("kube-apiserver not found at %s: run hack/apiserver/build.sh (builds it from the k8s.io/kubernetes module, 10-20 minutes on 2 cores; cached afterwards)", BinaryPath()))
	}
	if !executable(EtcdPath()) {
		missing = append(missing, "etcd not found: apt-get install -y etcd-server")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnavailable, strings.Join(missing, "; "))
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Start starts etcd and kube-apiserver with default Options and waits until
// the API server is ready. With a non-nil t it skips the test when the
// binaries are missing (fails it when KNP_REQUIRE_APISERVER=1), registers
// Stop with t.Cleanup, and logs the tail of both logs if the test failed.
func Start(ctx context.Context, t testing.TB) (*Server, error) {
	if t != nil {
		t.Helper()
	}
	return StartWithOptions(ctx, t, Options{})
}

// StartWithOptions is Start with Options.
func StartWithOptions(ctx context.Context, t testing.TB, opts Options) (*Server, error) {
	if t != nil {
		t.Helper()
	}
	if err := Available(); err != nil {
		if t != nil {
			if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
				t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
			}
			t.Skip(err.Error())
		}
		return nil, err
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = DefaultServiceCIDR
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = defaultReadyTimeout
	}

	sweepStale()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, opts: opts}
	if t != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("etcd log tail (%s):\n%s", s.etcdLog, logTail(s.etcdLog, 40))
				t.Logf("kube-apiserver log tail (%s):\n%s", s.apiLog, logTail(s.apiLog, 80))
			}
			if err := s.Stop(); err != nil {
				t.Errorf("apiserver: stop: %v", err)
			}
		})
	}
	if err := s.start(ctx); err != nil {
		err = fmt.Errorf("%w\netcd log tail:\n%s\nkube-apiserver log tail:\n%s",
			err, logTail(s.etcdLog, 20), logTail(s.apiLog, 60))
		if t == nil {
			_ = s.Stop()
		}
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	s.etcdLog = filepath.Join(s.Dir, "etcd.log")
	s.apiLog = filepath.Join(s.Dir, "kube-apiserver.log")
	p, err := writePKI(s.Dir)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	s.CAFile, s.CAPEM = p.caPath, p.caPEM
	s.Token, s.ProxyToken = randomToken(), randomToken()
	tokenFile := filepath.Join(s.Dir, "tokens.csv")
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,system:kube-proxy,kube-proxy\n", s.Token, s.ProxyToken)
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM)
	s.client = &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil, // 127.0.0.1 only, whatever HTTPS_PROXY says
			DialContext:         s.dialContext(),
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 8,
		},
	}

	if err := s.startEtcd(ctx); err != nil {
		return err
	}

	// Ports can be taken between picking and binding: retry with new ones.
	for attempt := 1; ; attempt++ {
		port, err := s.freePort()
		if err != nil {
			return err
		}
		s.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "https://" + s.Host
		s.apiArgv = []string{
			BinaryPath(),
			"--etcd-servers=" + s.EtcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(s.Dir, "cert-dir"),
			"--tls-cert-file=" + p.certFile,
			"--tls-private-key-file=" + p.keyFile,
			"--client-ca-file=" + p.caPath,
			"--token-auth-file=" + tokenFile,
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p.saPubFile,
			"--service-account-signing-key-file=" + p.saKeyFile,
			"--service-cluster-ip-range=" + s.opts.ServiceCIDR,
			"--authorization-mode=RBAC",
			// No controller-manager creates ServiceAccounts, so let Pods
			// in without one.
			"--disable-admission-plugins=ServiceAccount",
			"--allow-privileged=true",
			// The endpoint reconciler would publish --advertise-address
			// (127.0.0.1) as the "kubernetes" Service's endpoint, which
			// validation rejects as loopback, every 10s in the log. The
			// Service itself is still created, without endpoints.
			"--endpoint-reconciler-type=none",
			"--profiling=false",
			"--v=1",
		}
		s.apiArgv = append(s.apiArgv, s.opts.ExtraArgs...)
		err = s.startAPI(ctx)
		if err == nil || attempt == 3 || !strings.Contains(logTail(s.apiLog, 20), "address already in use") {
			if err != nil {
				return err
			}
			break
		}
	}
	if err := s.writeKubeconfigs(); err != nil {
		return err
	}
	return nil
}

func (s *Server) startEtcd(ctx context.Context) error {
	dataDir := filepath.Join(s.Dir, "etcd-data")
	for attempt := 1; ; attempt++ {
		cport, err := s.freePort()
		if err != nil {
			return err
		}
		pport, err := s.freePort()
		if err != nil {
			return err
		}
		s.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", cport)
		peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
		s.etcdArgv = []string{
			EtcdPath(),
			"--name=knp-e2e",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + s.EtcdURL,
			"--advertise-client-urls=" + s.EtcdURL,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=knp-e2e=" + peer,
			"--initial-cluster-state=new",
			"--logger=zap",
			"--log-outputs=stderr",
		}
		s.mu.Lock()
		s.etcd, err = startProc("etcd", s.etcdLog, s.inNetNS(s.etcdArgv))
		s.mu.Unlock()
		if err != nil {
			return err
		}
		err = s.waitEtcd(ctx)
		if err == nil {
			return nil
		}
		_ = s.etcd.stop(syscall.SIGKILL, 0)
		if attempt == 3 || !strings.Contains(logTail(s.etcdLog, 20), "address already in use") {
			return err
		}
		_ = os.RemoveAll(dataDir)
	}
}

func (s *Server) waitEtcd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DialContext: s.dialContext()}}
	var last string
	for {
		if s.etcd.exited() {
			return fmt.Errorf("etcd exited: %v", s.etcd.err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.EtcdURL+"/health", nil)
		resp, err := c.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			var h struct{ Health string }
			if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &h) == nil && h.Health == "true" {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd at %s not healthy: %v (last: %s)", s.EtcdURL, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startAPI starts kube-apiserver with s.apiArgv and waits until it is ready.
func (s *Server) startAPI(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errors.New("apiserver: server was stopped")
	}
	if s.api != nil && !s.api.exited() {
		s.mu.Unlock()
		return errors.New("apiserver: kube-apiserver is already running")
	}
	api, err := startProc("kube-apiserver", s.apiLog, s.inNetNS(s.apiArgv))
	s.api = api
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.WaitReady(ctx); err != nil {
		_ = api.stop(syscall.SIGKILL, 0)
		return err
	}
	return nil
}

// WaitReady polls until kube-apiserver answers /readyz with 200 and serves
// the "kubernetes" Service in "default" (so the default namespace and the
// Service IP allocator are up), within Options.ReadyTimeout or ctx.
func (s *Server) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.ReadyTimeout)
	defer cancel()
	s.mu.Lock()
	api := s.api
	s.mu.Unlock()
	start := time.Now()
	var last string
	for _, path := range []string{"/readyz", "/api/v1/namespaces/default/services/kubernetes"} {
		for {
			if api == nil || api.exited() {
				var exitErr error
				if api != nil {
					exitErr = api.err
				}
				return fmt.Errorf("kube-apiserver exited (%v) before it was ready; log: %s", exitErr, s.apiLog)
			}
			reqCtx, reqCancel := context.WithTimeout(ctx, 5*time.Second)
			req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, s.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+s.Token)
			resp, err := s.client.Do(req)
			if err == nil {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					reqCancel()
					break
				}
				last = fmt.Sprintf("%s %s: %s", path, resp.Status, bytes.TrimSpace(body))
			} else {
				last = fmt.Sprintf("%s: %v", path, err)
			}
			reqCancel()
			select {
			case <-ctx.Done():
				return fmt.Errorf("kube-apiserver at %s not ready after %v: %v (last: %s)",
					s.URL, time.Since(start).Round(time.Millisecond), ctx.Err(), last)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// KillAPIServer SIGKILLs kube-apiserver (as a crash would) and waits until
// it is gone. etcd keeps running with its data.
func (s *Server) KillAPIServer() error {
	return s.stopAPI(syscall.SIGKILL, 0)
}

// StopAPIServer stops kube-apiserver with SIGTERM (a graceful shutdown),
// SIGKILLing it after 30 seconds.
func (s *Server) StopAPIServer() error {
	return s.stopAPI(syscall.SIGTERM, 30*time.Second)
}

func (s *Server) stopAPI(sig syscall.Signal, grace time.Duration) error {
	s.mu.Lock()
	api := s.api
	s.mu.Unlock()
	return api.stop(sig, grace)
}

// StartAPIServer starts kube-apiserver again after KillAPIServer or
// StopAPIServer, on the same URL with the same certificates and tokens, and
// waits until it is ready.
func (s *Server) StartAPIServer(ctx context.Context) error {
	return s.startAPI(ctx)
}

// RestartAPIServer is KillAPIServer followed by StartAPIServer.
func (s *Server) RestartAPIServer(ctx context.Context) error {
	if err := s.KillAPIServer(); err != nil {
		return err
	}
	return s.StartAPIServer(ctx)
}

// APIServerRunning reports whether the kube-apiserver process is running.
func (s *Server) APIServerRunning() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.api != nil && !s.api.exited()
}

// APIServerPID is the running kube-apiserver's process id (0 if it is not
// running), for reading its CPU time from /proc.
func (s *Server) APIServerPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil || s.api.exited() {
		return 0
	}
	return s.api.cmd.Process.Pid
}

// Stop kills kube-apiserver and etcd and removes Dir (kept, and its path
// printed to stderr, when KNP_APISERVER_KEEP=1). It may be called more than once.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	api, etcd := s.api, s.etcd
	s.mu.Unlock()
	errs := []error{api.stop(syscall.SIGKILL, 0), etcd.stop(syscall.SIGTERM, 10*time.Second)}
	if s.client != nil {
		s.client.CloseIdleConnections()
	}
	if os.Getenv("KNP_APISERVER_KEEP") == "1" {
		_ = os.Remove(filepath.Join(s.Dir, ownerFile)) // so no sweep removes it
		fmt.Fprintf(os.Stderr, "apiserver: kept %s\n", s.Dir)
	} else if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// HTTPClient returns an HTTP client that trusts the server's CA. It adds
// no credentials: send "Authorization: Bearer "+Token, or use Do.
func (s *Server) HTTPClient() *http.Client { return s.client }

// StatusError is a non-2xx answer to Do.
type StatusError struct {
	Method, Path string
	Code         int
	Body         []byte
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Code, http.StatusText(e.Code), bytes.TrimSpace(e.Body))
}

// Do sends a request with the admin token: in, if not nil, is sent as JSON
// (or as is when it is a []byte), and a 2xx answer is decoded into out
// when out is not nil. Other statuses are returned as *StatusError.
func (s *Server) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, ok := in.([]byte)
		if !ok {
			var err error
			if b, err = json.Marshal(in); err != nil {
				return err
			}
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		ct := "application/json"
		if method == http.MethodPatch {
			ct = "application/merge-patch+json"
		}
		req.Header.Set("Content-Type", ct)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &StatusError{Method: method, Path: path, Code: resp.StatusCode, Body: data}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// writeKubeconfigs writes Kubeconfig and ProxyKubeconfig.
func (s *Server) writeKubeconfigs() error {
	s.Kubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	s.ProxyKubeconfig = filepath.Join(s.Dir, "kube-proxy.kubeconfig")
	for _, k := range []struct{ path, user, token string }{
		{s.Kubeconfig, "admin", s.Token},
		{s.ProxyKubeconfig, "kube-proxy", s.ProxyToken},
	} {
		if err := os.WriteFile(k.path, []byte(kubeconfig(s.URL, s.CAPEM, k.user, k.token)), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func kubeconfig(url string, caPEM []byte, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: knp-e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: %s
  context:
    cluster: knp-e2e
    user: %s
current-context: %s
`, url, base64.StdEncoding.EncodeToString(caPEM), user, token, user, user, user)
}

const (
	dirPrefix = "knp-apiserver-"
	ownerFile = "owner.pid"
)

// sweepStale removes the directories of Servers whose test process died
// without Stop (etcd's data alone is over 100 MB); their etcd and
// kube-apiserver died with it (Pdeathsig).
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
