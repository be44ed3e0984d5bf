package deploy

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// deploySubject is the ServiceAccount deploy/base/daemonset.yaml runs as.
const deploySubject = "system:serviceaccount:kube-system:kube-nftproxy"

// access is one request the proxy makes (or must not be able to make).
type access struct {
	group, resource, verb, namespace string
}

func (a access) String() string {
	return fmt.Sprintf("%s %s.%s in %q", a.verb, a.resource, a.group, a.namespace)
}

// deploy/base/rbac.yaml, created in a real kube-apiserver, lets the proxy's
// ServiceAccount do what the proxy does: watch Services, EndpointSlices and
// its Node and ServiceCIDRs, and record its Starting event (events.k8s.io/v1, namespace
// default, as kube-proxy's system:node-proxier allows); and nothing it has
// no use for.
func TestRBACGrantsWhatTheProxyUses(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver (skipped with -short)")
	}
	if err := apiserver.Available(); err != nil {
		t.Skipf("skipping API server test: %v", err)
	}
	ctx := context.Background()
	srv, err := apiserver.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range readManifests(t, "../../deploy/base/rbac.yaml") {
		if err := srv.Do(ctx, "POST", m.path, m.body, nil); err != nil {
			t.Fatalf("%s: creating %s %s: %v", m.file, m.kind, m.name, err)
		}
	}
	granted := []access{
		{"", "services", "list", ""}, {"", "services", "watch", ""},
		{"discovery.k8s.io", "endpointslices", "list", ""}, {"discovery.k8s.io", "endpointslices", "watch", ""},
		{"", "nodes", "list", ""}, {"", "nodes", "watch", ""},
		{"networking.k8s.io", "servicecidrs", "list", ""}, {"networking.k8s.io", "servicecidrs", "watch", ""},
		// The event sink creates, and patches a repeated event's series.
		{"events.k8s.io", "events", "create", "default"}, {"events.k8s.io", "events", "patch", "default"},
	}
	// The authorizer learns of new roles and bindings from its own
	// informers, a moment after they are created.
	testutil.WaitFor(t, 30*time.Second, "the authorizer to know deploy/'s binding", func() bool {
		return allowed(ctx, t, srv, granted[0])
	})
	// Nothing reads an object by name: informers list and watch.
	refused := []access{
		{"", "secrets", "list", ""}, {"", "nodes", "update", ""}, {"events.k8s.io", "events", "delete", "default"},
		{"", "services", "get", ""}, {"", "nodes", "get", ""}, {"discovery.k8s.io", "endpointslices", "get", ""},
		{"networking.k8s.io", "servicecidrs", "get", ""},
	}
	for _, c := range []struct {
		want    bool
		checked []access
	}{{true, granted}, {false, refused}} {
		for _, a := range c.checked {
			if got := allowed(ctx, t, srv, a); got != c.want {
				t.Errorf("%s may %s: %v, want %v", deploySubject, a, got, c.want)
			}
		}
	}
}

// allowed asks the API server's authorizer (a SubjectAccessReview, as the
// admin) whether deploySubject may make request a.
func allowed(ctx context.Context, t *testing.T, srv *apiserver.Server, a access) bool {
	t.Helper()
	review := authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   deploySubject,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: a.group, Resource: a.resource, Verb: a.verb, Namespace: a.namespace,
			},
		},
	}
	review.APIVersion, review.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
	var out authorizationv1.SubjectAccessReview
	if err := srv.Do(ctx, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review, &out); err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return out.Status.Allowed
}
