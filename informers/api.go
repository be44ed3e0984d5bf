package informers

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// APISource feeds a Builder from the API server with client-go informers:
// Services and EndpointSlices (without those kube-proxy ignores) and this
// node's Node object. While the API server is away the informers keep their
// caches, so the programmed rules stay; they relist when it returns and the
// Builder sees what changed meanwhile.
type APISource struct {
	Client       kubernetes.Interface
	Builder      *Builder
	ResyncPeriod time.Duration // 0: no periodic resync of the caches
	Log          *slog.Logger
	// OnChange is called once the caches have filled, then after every
	// event the Builder took (debouncing is the sync loop's job).
	OnChange func()
	// OnReady is called once, when the caches have filled and every listed
	// object has reached the Builder: its view is complete from then on.
	OnReady func()
	// OnError is called when listing or watching fails (the API server
	// cannot be reached, access is denied); OnRecovered when a probe of
	// the API server succeeds again after that. The informers keep their
	// caches meanwhile.
	OnError     func(error)
	OnRecovered func()
	// ProbeEvery is how often the API server is probed while failing
	// (0: every 5 s).
	ProbeEvery time.Duration
}

// ignoredSelector is kube-proxy's: objects of Services handed to another
// proxy, and headless Services' slices, are not ours.
func ignoredSelector() (labels.Selector, error) {
	noProxyName, err := labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	noHeadless, err := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*noProxyName, *noHeadless), nil
}

// Run starts the informers, waits for their first listing, and runs until
// ctx is done. It returns an error only if the caches never fill.
func (s *APISource) Run(ctx context.Context) error {
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sel, err := ignoredSelector()
	if err != nil {
		return fmt.Errorf("building label selector: %w", err)
	}
	slim := newSlimmer().slim
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }
	objects := informers.NewSharedInformerFactoryWithOptions(s.Client, s.ResyncPeriod,
		informers.WithTweakListOptions(tweak), informers.WithTransform(slim))
	// Without the factory's namespace index: nothing here looks objects
	// up, and the index holds every object's key once more.
	services := objects.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	slices := objects.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	nodes := informers.NewSharedInformerFactoryWithOptions(s.Client, s.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.Builder.NodeName()).String()
		}),
		informers.WithTransform(slim))

	// No sync before every cache has filled: a proxy restarting on a node
	// must not program a partial view over the rules it left there.
	var synced atomic.Bool
	changed := func() {
		if s.OnChange != nil && synced.Load() {
			s.OnChange()
		}
	}
	warn := func(err error) {
		if err != nil {
			log.Warn("skipping bad input", "err", err)
		}
	}
	handlers := []struct {
		informer cache.SharedIndexInformer
		upsert   func(any)
		remove   func(any)
	}{
		{services,
			func(o any) {
				if svc, ok := o.(*corev1.Service); ok {
					warn(s.Builder.UpsertService(svc))
				}
			},
			func(o any) {
				if svc, ok := unwrap(o).(*corev1.Service); ok {
					s.Builder.DeleteService(svc.Namespace, svc.Name)
				}
			}},
		{slices,
			func(o any) {
				if es, ok := o.(*discoveryv1.EndpointSlice); ok {
					warn(s.Builder.UpsertEndpointSlice(es))
				}
			},
			func(o any) {
				if es, ok := unwrap(o).(*discoveryv1.EndpointSlice); ok {
					s.Builder.RemoveEndpointSlice(es)
				}
			}},
		{nodes.Core().V1().Nodes().Informer(),
			func(o any) {
				if n, ok := o.(*corev1.Node); ok {
					warn(s.Builder.UpsertNode(n))
				}
			},
			func(o any) {
				if n, ok := unwrap(o).(*corev1.Node); ok {
					s.Builder.DeleteNode(n.Name)
				}
			}},
	}
	failing := make(chan struct{}, 1)
	onWatchError := func(r *cache.Reflector, err error) {
		if s.OnError != nil {
			s.OnError(fmt.Errorf("listing or watching %s: %w", r.TypeDescription(), err))
		}
		select {
		case failing <- struct{}{}:
		default:
		}
	}
	var handlersSynced []cache.InformerSynced
	for _, h := range handlers {
		if err := h.informer.SetWatchErrorHandler(onWatchError); err != nil {
			return fmt.Errorf("adding watch error handler: %w", err)
		}
		reg, err := h.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { h.upsert(o); changed() },
			UpdateFunc: func(_, o any) { h.upsert(o); changed() },
			DeleteFunc: func(o any) { h.remove(o); changed() },
		})
		if err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		handlersSynced = append(handlersSynced, reg.HasSynced)
	}
	go s.probeWhileFailing(ctx, failing)
	objects.Start(ctx.Done())
	nodes.Start(ctx.Done())
	defer objects.Shutdown()
	defer nodes.Shutdown()
	for typ, ok := range objects.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("listing %v from the API server did not complete", typ)
		}
	}
	for typ, ok := range nodes.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("listing %v from the API server did not complete", typ)
		}
	}
	// A filled cache is not enough: the handlers must also have passed
	// every listed object to the Builder (found by the 5k-Service e2e
	// test, whose first sync had 70 of 50,000 endpoints).
	if !cache.WaitForCacheSync(ctx.Done(), handlersSynced...) {
		return fmt.Errorf("handling the first listing from the API server did not complete")
	}
	log.Info("API server caches filled")
	synced.Store(true)
	if s.OnReady != nil {
		s.OnReady()
	}
	changed()
	<-ctx.Done()
	return nil
}

// probeWhileFailing asks the API server for its version after each
// reported failure, until it answers: the informers retry on their own, but
// say nothing when they succeed again.
func (s *APISource) probeWhileFailing(ctx context.Context, failing <-chan struct{}) {
	every := s.ProbeEvery
	if every == 0 {
		every = 5 * time.Second
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-failing:
		}
		t := time.NewTicker(every)
		for up := false; !up; {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				_, err := s.Client.Discovery().ServerVersion()
				up = err == nil
				if !up && s.OnError != nil {
					s.OnError(fmt.Errorf("probing the API server: %w", err))
				}
			}
		}
		t.Stop()
		if s.OnRecovered != nil {
			s.OnRecovered()
		}
	}
}

// unwrap returns the last known object of a deletion seen only on relist.
func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}
