package apisource

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// ServiceCIDRs (networking.k8s.io/v1, GA since Kubernetes 1.33) feed the
// nftables mode's drop of traffic to unallocated ClusterIPs. They are
// optional: an API server that does not serve them (older, or the resource
// turned off) or does not let us list them (RBAC not updated) costs that
// check only, never the sync. Their informer starts only when discovery
// lists the resource, its watch errors are logged rather than taken for
// the API server's, and the first sync waits for its listing at most
// serviceCIDRWait.

// serviceCIDRWait bounds how long the first sync waits for the ServiceCIDRs
// after the other caches filled: they are a handful of objects, listed at
// once from a server that serves them.
const serviceCIDRWait = 2 * time.Second

// serviceCIDRInformer returns the ServiceCIDRs' informer factory, or nil
// when the API server does not serve the resource.
func (s *APISource) serviceCIDRInformer(log *slog.Logger) informers.SharedInformerFactory {
	gv := networkingv1.SchemeGroupVersion.String()
	list, err := s.Client.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil || list == nil || !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }) {
		log.Info("the API server does not serve ServiceCIDRs: traffic to unallocated ClusterIPs is not dropped",
			"groupVersion", gv, "err", err)
		return nil
	}
	return informers.NewSharedInformerFactoryWithOptions(s.Client, s.ResyncPeriod,
		informers.WithTransform(kube.NewSlimmer().Slim))
}

// optionalWatchError logs an optional informer's listing or watch errors,
// once per distinct message: the reflector retries with backoff.
func optionalWatchError(log *slog.Logger) cache.WatchErrorHandler {
	var mu sync.Mutex
	last := ""
	return func(r *cache.Reflector, err error) {
		mu.Lock()
		defer mu.Unlock()
		if msg := err.Error(); msg != last {
			last = msg
			log.Warn("listing or watching ServiceCIDRs failed; going on without them until it works",
				"type", r.TypeDescription(), "err", err)
		}
	}
}

// waitOptional waits for the optional informers' first listing, at most
// serviceCIDRWait, and logs when it goes on without them.
func waitOptional(ctx context.Context, log *slog.Logger, synced []cache.DoneChecker) {
	if len(synced) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, serviceCIDRWait)
	defer cancel()
	if !cache.WaitFor(wctx, "", synced...) && ctx.Err() == nil {
		log.Warn("ServiceCIDRs not listed yet; syncing without them", "waited", serviceCIDRWait)
	}
}
