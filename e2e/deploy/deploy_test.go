// Package deploy checks the manifests in deploy/ against a real API server.
package deploy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
)

// collection is where objects of a kind are created.
var collection = map[string]string{
	"v1/ServiceAccount":                               "/api/v1/namespaces/%s/serviceaccounts",
	"v1/ConfigMap":                                    "/api/v1/namespaces/%s/configmaps",
	"apps/v1/DaemonSet":                               "/apis/apps/v1/namespaces/%s/daemonsets",
	"rbac.authorization.k8s.io/v1/ClusterRole":        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}

// Every manifest is accepted by a real kube-apiserver (server-side dry run:
// full validation and admission, nothing stored).
func TestManifestsAreValid(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver (skipped with -short)")
	}
	ctx := context.Background()
	srv, err := apiserver.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../../deploy/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests found: %v", err)
	}
	kinds := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var obj struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if err := yaml.Unmarshal(js, &obj); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			key := obj.APIVersion + "/" + obj.Kind
			path, ok := collection[key]
			if !ok {
				t.Fatalf("%s document %d: no test path for %s", f, i, key)
			}
			path = strings.Replace(path, "%s", obj.Metadata.Namespace, 1)
			var body any
			if err := yaml.Unmarshal(js, &body); err != nil {
				t.Fatal(err)
			}
			if err := srv.Do(ctx, "POST", path+"?dryRun=All&fieldValidation=Strict", body, nil); err != nil {
				t.Errorf("%s: %s %s refused: %v", filepath.Base(f), obj.Kind, obj.Metadata.Name, err)
			}
			kinds[obj.Kind] = true
		}
	}
	for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} {
		if !kinds[k] {
			t.Errorf("deploy/ has no %s", k)
		}
	}
}
