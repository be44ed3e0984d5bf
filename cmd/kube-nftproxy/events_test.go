package main

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// The Starting event is kube-proxy's: on the Node by name, in namespace
// default, type Normal, reason Starting, action StartKubeProxy, reported
// by kube-proxy from this host. An API server that refuses it costs a log
// line (client-go's), never a blocked start or stop.
func TestNodeEventsStarting(t *testing.T) {
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "", nil)
	}
	for _, refuse := range []bool{false, true} {
		t.Run(map[bool]string{false: "recorded", true: "refused"}[refuse], func(t *testing.T) {
			client := fake.NewClientset()
			if refuse {
				client.PrependReactor("create", "events", forbidden)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ev := startNodeEvents(ctx, client, "node-1", slog.New(slog.DiscardHandler))
			ev.starting()
			if refuse {
				// client-go logs the refusal (through klog) and gives up.
				testutil.WaitFor(t, 5*time.Second, "the event's create request", func() bool {
					return slices.ContainsFunc(client.Actions(), func(a k8stesting.Action) bool {
						return a.Matches("create", "events")
					})
				})
				stopWithin(t, ev, 5*time.Second)
				return
			}
			var got eventsv1.Event
			testutil.WaitFor(t, 5*time.Second, "the Starting event", func() bool {
				list, err := client.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
				if err != nil || len(list.Items) == 0 {
					return false
				}
				got = list.Items[0]
				return true
			})
			want := startingFields{
				regarding:  corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "node-1"},
				typ:        corev1.EventTypeNormal,
				reason:     "Starting",
				action:     "StartKubeProxy",
				controller: "kube-proxy",
				instance:   "kube-proxy-" + hostname,
			}
			if f := fieldsOf(&got); f != want {
				t.Errorf("event:\n got %+v\nwant %+v", f, want)
			}
			if !strings.HasPrefix(got.Name, "node-1.") || got.EventTime.IsZero() {
				t.Errorf("event name %q, eventTime %v: want node-1.<hex>, a time", got.Name, got.EventTime)
			}
			stopWithin(t, ev, 5*time.Second)
		})
	}
}

// startingFields are the fields of an event kube-proxy sets.
type startingFields struct {
	regarding                                       corev1.ObjectReference
	typ, reason, action, note, controller, instance string
}

func fieldsOf(e *eventsv1.Event) startingFields {
	return startingFields{regarding: e.Regarding, typ: e.Type, reason: e.Reason, action: e.Action, note: e.Note,
		controller: e.ReportingController, instance: e.ReportingInstance}
}

// stopWithin fails t when stopping ev takes longer than d.
func stopWithin(t *testing.T, ev *nodeEvents, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		ev.stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("stopping the event broadcaster took longer than %v", d)
	}
}
