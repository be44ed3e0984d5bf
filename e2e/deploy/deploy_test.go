// Package deploy checks the manifests in deploy/ against a real API server.
package deploy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
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
	"rbac.authorization.k8s.io/v1/Role":               "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
	"rbac.authorization.k8s.io/v1/RoleBinding":        "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
}

// manifest is one document of a file in deploy/.
type manifest struct {
	file, kind, name string
	path             string // the collection it is created in
	body             any
}

// readManifests splits files into their documents, failing t on a
// document it cannot read or whose kind has no collection above.
func readManifests(t *testing.T, files ...string) []manifest {
	t.Helper()
	var out []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parseManifests(t, strings.TrimPrefix(f, "../../"), data)...)
	}
	return out
}

// parseManifests splits data, a stream of YAML documents from file, into
// its objects.
func parseManifests(t *testing.T, file string, data []byte) []manifest {
	t.Helper()
	var out []manifest
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
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		if err := yaml.Unmarshal(js, &obj); err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		key := obj.APIVersion + "/" + obj.Kind
		path, ok := collection[key]
		if !ok {
			t.Fatalf("%s document %d: no test path for %s", file, i, key)
		}
		m := manifest{file: file, kind: obj.Kind, name: obj.Metadata.Name,
			path: strings.Replace(path, "%s", obj.Metadata.Namespace, 1)}
		if err := yaml.Unmarshal(js, &m.body); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// Every manifest is accepted by a real kube-apiserver (server-side dry run:
// full validation and admission, nothing stored): the files, and what
// kubectl kustomize renders of deploy/ and each overlay (when kubectl is
// cached).
func TestManifestsAreValid(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver (skipped with -short)")
	}
	ctx := context.Background()
	srv, err := apiserver.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	files := manifestFiles(t, "../../deploy/base/*.yaml", "../../deploy/cleanup/*.yaml", "../../deploy/kubeadm/*.yaml")
	manifests := readManifests(t, files...)
	if kubectl, err := findKubectl(); err == nil {
		for _, o := range overlays {
			manifests = append(manifests, parseManifests(t, "kubectl kustomize "+o.dir, kustomize(t, kubectl, o.dir))...)
		}
	} else {
		t.Logf("only the files: %v", err)
	}
	kinds := map[string]bool{}
	for _, m := range manifests {
		if err := srv.Do(ctx, "POST", m.path+"?dryRun=All&fieldValidation=Strict", m.body, nil); err != nil {
			t.Errorf("%s: %s %s refused: %v", m.file, m.kind, m.name, err)
		}
		kinds[m.kind] = true
	}
	for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} {
		if !kinds[k] {
			t.Errorf("deploy/ has no %s", k)
		}
	}
}

// manifestFiles are the files each pattern matches but kustomization.yaml,
// failing t on a pattern that matches none.
func manifestFiles(t *testing.T, patterns ...string) []string {
	t.Helper()
	var files []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil || len(m) == 0 {
			t.Fatalf("no manifests match %s: %v", p, err)
		}
		// kustomization.yaml is kustomize's, not an object.
		files = append(files, slices.DeleteFunc(m, func(f string) bool { return filepath.Base(f) == "kustomization.yaml" })...)
	}
	return files
}
