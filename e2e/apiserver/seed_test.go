package apiserver

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSaveAndLoadData saves one server's data, deletes the Service it
// held, and loads the data into that server and into a second one (other
// ports, other certificates): both serve the Service again with its
// ClusterIP.
func TestSaveAndLoadData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	a, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	const path = "/api/v1/namespaces/default/services"
	var created corev1.Service
	if err := a.Do(ctx, http.MethodPost, path, svc, &created); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "seed")
	if err := a.SaveData(ctx, seed); err != nil {
		t.Fatal(err)
	}
	if err := a.Do(ctx, http.MethodDelete, path+"/kept", nil, nil); err != nil {
		t.Fatalf("the server did not run on after SaveData: %v", err)
	}
	b, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Server{"the same server": a, "a second server": b} {
		if err := s.LoadData(ctx, seed); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got corev1.Service
		if err := s.Do(ctx, http.MethodGet, path+"/kept", nil, &got); err != nil {
			t.Fatalf("%s after LoadData: %v", name, err)
		}
		if got.Spec.ClusterIP != created.Spec.ClusterIP {
			t.Errorf("%s: ClusterIP %s, saved %s", name, got.Spec.ClusterIP, created.Spec.ClusterIP)
		}
	}
	err = a.LoadData(ctx, filepath.Join(t.TempDir(), "none"))
	if !errors.Is(err, os.ErrNotExist) || !a.APIServerRunning() {
		t.Errorf("LoadData of a directory without data: %v (running: %v), want an error before stopping anything", err, a.APIServerRunning())
	}
}
