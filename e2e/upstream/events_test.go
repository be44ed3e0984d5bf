package upstream

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startingEventsBy lists the Starting events on Node localNode, keyed by
// the field manager that wrote them (the writer's user agent:
// "kube-proxy" for upstream's, "kube-nftproxy" for ours).
func (pp *proxyPair) startingEventsBy(ctx context.Context) (map[string]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := pp.srv.Do(ctx, "GET", "/apis/events.k8s.io/v1/namespaces/default/events", nil, &list); err != nil {
		return nil, err
	}
	by := map[string]eventsv1.Event{}
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == localNode && e.Reason == "Starting" && len(e.ManagedFields) > 0 {
			by[e.ManagedFields[0].Manager] = e
		}
	}
	return by, nil
}

// compareStartingEvents: both proxies recorded a Starting event on their
// Node, and the two are the same but for what names and dates an event
// and who wrote it.
func (pp *proxyPair) compareStartingEvents(t *testing.T) {
	t.Helper()
	var by map[string]eventsv1.Event
	waitFor(t, pp.ours, 15*time.Second, "Starting events from both proxies", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var err error
		if by, err = pp.startingEventsBy(ctx); err != nil {
			t.Logf("listing events: %v", err)
			return false
		}
		_, up := by["kube-proxy"]
		_, ours := by["kube-nftproxy"]
		return up && ours
	})
	up, ours := comparable(by["kube-proxy"]), comparable(by["kube-nftproxy"])
	if !reflect.DeepEqual(up, ours) {
		u, _ := json.Marshal(up)
		o, _ := json.Marshal(ours)
		t.Errorf("the Starting events differ:\nkube-proxy:    %s\nkube-nftproxy: %s", u, o)
	}
	t.Logf("Starting event of both: type %s, reason %s, action %s, reportingController %s, reportingInstance %s, regarding %+v",
		ours.Type, ours.Reason, ours.Action, ours.ReportingController, ours.ReportingInstance, ours.Regarding)
}

// comparable is e without its name, times and writer: what two proxies'
// events of the same kind share.
func comparable(e eventsv1.Event) eventsv1.Event {
	e.ObjectMeta = metav1.ObjectMeta{Namespace: e.Namespace}
	e.EventTime = metav1.MicroTime{}
	return e
}
