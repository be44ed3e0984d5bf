package cluster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The proxy's credentials at their shortest: a projected service account
// token of the least lifetime the API server accepts, which kubelet
// replaces once 80% of it has passed (every 8 minutes).
const (
	tokenLifetime  = 600 // seconds
	tokenRotations = 3
	// tokenRotationWait bounds the wait for the rotations: kubelet looks
	// at a pod's volumes about once a minute.
	tokenRotationWait = tokenRotations*8*time.Minute + 5*time.Minute
)

// shortTokenPatch gives our DaemonSet's proxy container a projected token
// of tokenLifetime at the path of the automounted one, which it turns off.
var shortTokenPatch = fmt.Sprintf(`{"spec":{"template":{"spec":{"automountServiceAccountToken":false,`+
	`"volumes":[{"name":"short-token","projected":{"sources":[`+
	`{"serviceAccountToken":{"path":"token","expirationSeconds":%d}},`+
	`{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}]}}],`+
	`"containers":[{"name":"kube-nftproxy","volumeMounts":[{"name":"short-token",`+
	`"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true}]}]}}}}`, tokenLifetime)

// TestClusterFaultTokenRotation runs our DaemonSet with a 10-minute token
// and, with the streams and the long-lived flows running, waits for
// kubelet to replace each node's token three times. Its watches are
// re-opened every 5-10 minutes (client-go's watch timeout), so a proxy
// that kept its first token would be refused from the tenth minute on.
// Then: no request of ours refused by the API server, and a Service
// created last answers through the rules.
func TestClusterFaultTokenRotation(t *testing.T) {
	l, _ := faultsCluster(t, ProxyOurs)
	ctx, cancel := testContext(t)
	defer cancel()
	r := l.faultsWorkloads(ctx, t)
	defer r.finish(t)
	r.measure(ctx, t, "cluster-token-rotation", func() error {
		since, err := fileSize(l.logFile("kube-apiserver"))
		if err != nil {
			return err
		}
		if err := l.shortLivedTokens(ctx); err != nil {
			return err
		}
		if err := l.waitTokenRotations(ctx, t); err != nil {
			return err
		}
		if err := l.noAuthFailures(since); err != nil {
			return err
		}
		return r.newServiceAnswers(ctx, t)
	})
}

// shortLivedTokens rolls our DaemonSet onto shortTokenPatch.
func (l Layout) shortLivedTokens(ctx context.Context) error {
	if _, err := l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", "kube-nftproxy", "-p", shortTokenPatch); err != nil {
		return err
	}
	if err := l.waitRollout(ctx, "kube-system", "daemonset/kube-nftproxy"); err != nil {
		return err
	}
	_, err := l.waitProxyPods(ctx, "kube-nftproxy", nil, "")
	return err
}

// waitTokenRotations reads each proxy pod's token file on its node (in
// kubelet's pod directory) until every pod has had
// tokenRotations new tokens, and logs each one's issue and expiry times.
func (l Layout) waitTokenRotations(ctx context.Context, t *testing.T) error {
	pods, err := l.tokenFiles(ctx)
	if err != nil {
		return err
	}
	seen := map[string][]string{} // pod -> tokens in order
	return poll(ctx, tokenRotationWait, func() (bool, error) {
		done := true
		for pod, file := range pods {
			b, err := os.ReadFile(file)
			if err != nil {
				return false, fmt.Errorf("%s's token: %w", pod, err)
			}
			tok := strings.TrimSpace(string(b))
			if s := seen[pod]; len(s) == 0 || s[len(s)-1] != tok {
				seen[pod] = append(s, tok)
				t.Logf("%s %s: token %d: %s", time.Now().Format("15:04:05"), pod, len(seen[pod]), tokenTimes(tok))
			}
			done = done && len(seen[pod]) > tokenRotations
		}
		return done, nil
	})
}

// tokenFiles maps each of our proxy pods to its token file on its node.
func (l Layout) tokenFiles(ctx context.Context) (map[string]string, error) {
	out, err := l.kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=kube-nftproxy", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		for _, n := range l.Nodes {
			if n.Name == f[2] {
				files[f[0]] = filepath.Join(l.kubeletRoot(n), "pods", f[1], "volumes", "kubernetes.io~projected", "short-token", "token")
			}
		}
	}
	if len(files) != len(l.Nodes) {
		return nil, fmt.Errorf("our pods %q: want one per node", out)
	}
	return files, nil
}

// tokenTimes says when a service account token was issued and expires.
func tokenTimes(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "not a JWT"
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return err.Error()
	}
	var claims struct{ Iat, Exp int64 }
	if err := json.Unmarshal(payload, &claims); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("issued %s, expires %s", time.Unix(claims.Iat, 0).UTC().Format("15:04:05"),
		time.Unix(claims.Exp, 0).UTC().Format("15:04:05"))
}

// noAuthFailures fails on any request the API server could not
// authenticate since offset since of its log: every client of the cluster
// but the proxy has a certificate, so such a line is the proxy's token.
func (l Layout) noAuthFailures(since int64) error {
	b, err := os.ReadFile(l.logFile("kube-apiserver"))
	if err != nil {
		return err
	}
	if since > int64(len(b)) {
		since = 0
	}
	var bad []string
	for _, line := range strings.Split(string(b[since:]), "\n") {
		if strings.Contains(line, "Unable to authenticate") || strings.Contains(line, "token has expired") {
			bad = append(bad, line)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("the API server refused %d requests, first: %s", len(bad), bad[0])
	}
	return nil
}

// newServiceAnswers creates a Service for the echo pods now, waits until
// its ClusterIP answers from the client pod, and deletes it: the proxy
// still sees changes.
func (r *faultRun) newServiceAnswers(ctx context.Context, t *testing.T) error {
	svc := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: late\n  namespace: %s\nspec:\n"+
		"  selector:\n    role: echo\n  ports:\n  - port: 80\n    targetPort: 8080\n", faultsNS)
	start := time.Now()
	if err := r.l.apply(ctx, "faults-late", svc); err != nil {
		return err
	}
	ip, err := r.l.kubectl(ctx, "-n", faultsNS, "get", "svc", "late", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	late := []target{{"a Service created after the rotations", "tcp", strings.TrimSpace(ip) + ":80"}}
	if err := r.l.waitAnswered(ctx, r.l.clientNetNS(ctx, t), late); err != nil {
		return fmt.Errorf("a Service created after the rotations never answered: %w", err)
	}
	t.Logf("a Service created after the rotations answered in %v", time.Since(start).Round(10*time.Millisecond))
	_, err = r.l.kubectl(ctx, "-n", faultsNS, "delete", "service", "late")
	return err
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
