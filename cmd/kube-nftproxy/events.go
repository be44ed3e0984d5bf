package main

import (
	"context"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
)

// The fields of kube-proxy's events, kept so that tools which look for
// kube-proxy's events (by reporting controller, reason or action) find ours.
const (
	// eventController is the events' reportingController; client-go makes
	// the reportingInstance "kube-proxy-<hostname>" of it.
	eventController = "kube-proxy"
	// eventActionStart is the action of every event kube-proxy records
	// while it starts.
	eventActionStart = "StartKubeProxy"
	// eventReasonStarting is the reason of the event recorded once the
	// proxy is set up and about to sync.
	eventReasonStarting = "Starting"
)

// nodeEvents records events (events.k8s.io/v1) on this proxy's Node, as
// kube-proxy does. Recording never blocks or fails the proxy: client-go
// sends each event in the background, retries while the API server is
// away, and logs what it could not write.
type nodeEvents struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	node        *corev1.ObjectReference
}

// startNodeEvents starts sending events to the API server of client until
// ctx ends or stop is called. Events are only sent once this has run: an
// event recorded earlier would reach no sink and be lost.
func startNodeEvents(ctx context.Context, client kubernetes.Interface, node string, log *slog.Logger) *nodeEvents {
	// client-go logs what it could not send through klog, which is the
	// proxy's log output (startLogging).
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		log.Warn("could not start recording events; none are sent", "err", err)
	}
	return &nodeEvents{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, eventController),
		// As kube-proxy's: the Node by name only (no UID), so the event
		// lands in namespace "default".
		node: &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
	}
}

// starting records that the proxy has started.
func (e *nodeEvents) starting() {
	e.recorder.Eventf(e.node, nil, corev1.EventTypeNormal, eventReasonStarting, eventActionStart, "")
}

// stop shuts the broadcaster down; events not yet sent are dropped.
func (e *nodeEvents) stop() { e.broadcaster.Shutdown() }
