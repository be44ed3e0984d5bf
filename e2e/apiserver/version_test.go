package apiserver

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestServerReportsBuiltVersion checks that the server the harness runs is
// the one hack/apiserver/build.sh (hack/cluster/build.sh) builds, stamped
// with its Kubernetes version: kubelet, kubectl and upstream's e2e.test
// compare versions with the server's /version, so an unstamped
// ("v0.0.0-master") or stale binary must not pass unnoticed.
func TestServerReportsBuiltVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	if os.Getenv("KNP_KUBE_APISERVER") != "" {
		t.Skip("KNP_KUBE_APISERVER names another binary; its version is not known")
	}
	want := os.Getenv("KNP_K8S_VERSION")
	if want == "" {
		want = DefaultVersion
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		GitVersion   string `json:"gitVersion"`
		GitTreeState string `json:"gitTreeState"`
	}
	if err := s.Do(ctx, "GET", "/version", nil, &info); err != nil {
		t.Fatalf("GET /version: %v", err)
	}
	if info.GitVersion != want || info.GitTreeState != "clean" {
		t.Errorf("/version = %+v, want gitVersion %s, gitTreeState clean", info, want)
	}
}
