package apiserver

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEtcdRestartAndPause restarts etcd under a running kube-apiserver and
// pauses kube-apiserver with SIGSTOP: a Service written before is read
// back after each, a request to the paused server times out, and one
// after ResumeAPIServer succeeds.
func TestEtcdRestartAndPause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	const path = "/api/v1/namespaces/default/services"
	if err := s.Do(ctx, http.MethodPost, path, svc, nil); err != nil {
		t.Fatal(err)
	}
	read := func(when string) {
		t.Helper()
		var got corev1.Service
		if err := s.Do(ctx, http.MethodGet, path+"/kept", nil, &got); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}

	t0 := time.Now()
	if err := s.RestartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd back after %v", time.Since(t0).Round(time.Millisecond))
	// kube-apiserver reconnects on its own; its first requests may fail.
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	read("after the etcd restart")

	if err := s.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	err = s.Do(short, http.MethodGet, path+"/kept", nil, nil)
	stop()
	if err == nil {
		t.Fatal("a request to the SIGSTOPped kube-apiserver succeeded")
	}
	t.Logf("request to the paused server: %v", err)
	if err := s.ResumeAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	read("after SIGCONT")
}
