// Package apisource feeds a kube.Builder from the API server with
// client-go informers: Services and EndpointSlices (without those
// kube-proxy ignores) and this node's Node, slimmed to the fields the
// Builder reads. A watchdog probes the API server and, with an APIClient,
// holds the informers' requests back and closes their connections while it
// does not answer, so a server gone silent is noticed within a probe period.
package apisource

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
	Builder      *kube.Builder
	ResyncPeriod time.Duration // 0: no periodic resync of the caches
	Log          *slog.Logger
	// OnChange is called once the caches have filled, then after every
	// event the Builder took (debouncing is the sync loop's job).
	OnChange func()
	// OnReady is called once, when the caches have filled and every listed
	// object has reached the Builder: its view is complete from then on.
	OnReady func()
	// OnError is called when listing or watching fails (the API server
	// cannot be reached, access is denied) and when a probe of the API
	// server fails; OnRecovered when a probe succeeds again after that.
	// The informers keep their caches meanwhile.
	OnError     func(error)
	OnRecovered func()
	// ProbeEvery is how often the API server is probed while it answers
	// (0: every 30 s); while it does not, more often (every 0.5 s backing
	// off to at most 5 s or ProbeEvery).
	ProbeEvery time.Duration
	// Probe asks whether the API server answers (nil: a GET of /livez;
	// see probe).
	Probe func(context.Context) error
}

// ignoredSelector is kube-proxy's: objects of Services handed to another
// proxy, and headless Services' slices, are not ours.
func ignoredSelector() (labels.Selector, error) {
	noProxyName, err := labels.NewRequirement(kube.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	noHeadless, err := labels.NewRequirement(kube.LabelHeadless, selection.DoesNotExist, nil)
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
	objects, nodes, sources, err := s.informers()
	if err != nil {
		return err
	}
	cidrs := s.serviceCIDRInformer(log)
	if cidrs != nil {
		sources.cidrs = cidrs.Networking().V1().ServiceCIDRs().Informer()
	}
	// No sync before every cache has filled: a proxy restarting on a node
	// must not program a partial view over the rules it left there.
	var synced atomic.Bool
	changed := func() {
		if s.OnChange != nil && synced.Load() {
			s.OnChange()
		}
	}
	dog := s.watchdog()
	onWatchError := func(r *cache.Reflector, err error) {
		dog.failed(fmt.Errorf("listing or watching %s: %w", r.TypeDescription(), err))
	}
	var handlersSynced, optionalSynced []cache.DoneChecker
	for _, h := range s.handlers(log, sources) {
		onError := onWatchError
		if h.optional {
			onError = optionalWatchError(log)
		}
		if err := h.informer.SetWatchErrorHandler(onError); err != nil {
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
		if h.optional {
			optionalSynced = append(optionalSynced, reg.HasSyncedChecker())
		} else {
			handlersSynced = append(handlersSynced, reg.HasSyncedChecker())
		}
	}
	go dog.run(ctx)
	objects.Start(ctx.Done())
	nodes.Start(ctx.Done())
	defer objects.Shutdown()
	defer nodes.Shutdown()
	if cidrs != nil {
		cidrs.Start(ctx.Done())
		defer cidrs.Shutdown()
	}
	if err := waitFilled(ctx, handlersSynced, objects, nodes); err != nil {
		return err
	}
	waitOptional(ctx, log, optionalSynced)
	log.Info("API server caches filled")
	synced.Store(true)
	if s.OnReady != nil {
		s.OnReady()
	}
	changed()
	<-ctx.Done()
	return nil
}

// apiInformers are the Service, EndpointSlice and Node informers, and the
// ServiceCIDR one (nil when the API server does not serve them).
type apiInformers struct {
	services, slices, nodes, cidrs cache.SharedIndexInformer
}

// informers builds the factories: one for Services and EndpointSlices
// (without those kube-proxy ignores), one for this node's Node.
func (s *APISource) informers() (objects, nodes informers.SharedInformerFactory, in apiInformers, err error) {
	sel, err := ignoredSelector()
	if err != nil {
		return nil, nil, in, fmt.Errorf("building label selector: %w", err)
	}
	slim := kube.NewSlimmer().Slim
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }
	objects = informers.NewSharedInformerFactoryWithOptions(s.Client, s.ResyncPeriod,
		informers.WithTweakListOptions(tweak), informers.WithTransform(slim))
	// Without the factory's namespace index: nothing here looks objects
	// up, and the index holds every object's key once more.
	in.services = objects.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	in.slices = objects.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	nodes = informers.NewSharedInformerFactoryWithOptions(s.Client, s.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.Builder.NodeName()).String()
		}),
		informers.WithTransform(slim))
	in.nodes = nodes.Core().V1().Nodes().Informer()
	return objects, nodes, in, nil
}

// apiHandler passes one informer's objects to the Builder. An optional
// one does not hold the first sync back for long (see waitOptional), and
// its failures do not count as the API server's.
type apiHandler struct {
	informer cache.SharedIndexInformer
	upsert   func(any)
	remove   func(any)
	optional bool
}

// typedHandler passes informer's objects of type T to upsert, and those
// deleted (also from a tombstone) to remove; warn gets upsert's errors.
func typedHandler[T any](informer cache.SharedIndexInformer, warn func(error), upsert func(T) error, remove func(T)) apiHandler {
	return apiHandler{informer: informer,
		upsert: func(o any) {
			if v, ok := o.(T); ok {
				warn(upsert(v))
			}
		},
		remove: func(o any) {
			if v, ok := unwrap(o).(T); ok {
				remove(v)
			}
		}}
}

func (s *APISource) handlers(log *slog.Logger, in apiInformers) []apiHandler {
	warn := func(err error) {
		if err != nil {
			log.Warn("skipping bad input", "err", err)
		}
	}
	hs := []apiHandler{
		typedHandler(in.services, warn, s.Builder.UpsertService,
			func(svc *corev1.Service) { s.Builder.DeleteService(svc.Namespace, svc.Name) }),
		typedHandler(in.slices, warn, s.Builder.UpsertEndpointSlice, s.Builder.RemoveEndpointSlice),
		typedHandler(in.nodes, warn, s.Builder.UpsertNode,
			func(n *corev1.Node) { s.Builder.DeleteNode(n.Name) }),
	}
	if in.cidrs != nil {
		h := typedHandler(in.cidrs, warn, s.Builder.UpsertServiceCIDR,
			func(sc *networkingv1.ServiceCIDR) { s.Builder.DeleteServiceCIDR(sc.Name) })
		h.optional = true
		hs = append(hs, h)
	}
	return hs
}

// waitFilled waits until both factories' caches have filled and the
// handlers have passed every listed object to the Builder.
func waitFilled(ctx context.Context, handlersSynced []cache.DoneChecker, factories ...informers.SharedInformerFactory) error {
	for _, f := range factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("listing %v from the API server did not complete", typ)
			}
		}
	}
	// A filled cache is not enough: the handlers must also have passed
	// every listed object to the Builder (else a first sync can miss most
	// endpoints). Waited for on their channels: cache.WaitForCacheSync
	// polls every 100 ms, a large part of a small cluster's start-up.
	if !cache.WaitFor(ctx, "", handlersSynced...) {
		return fmt.Errorf("handling the first listing from the API server did not complete")
	}
	return nil
}

// watchdog builds the prober of the API server. With an APIClient, a
// probe without an answer holds the informers' requests back and closes
// its connections, as does a connection that cannot be opened.
func (s *APISource) watchdog() *apiWatchdog {
	every := s.ProbeEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	dog := newAPIWatchdog(s.probe(), every)
	dog.onError, dog.onRecovered = s.OnError, s.OnRecovered
	if c, ok := s.Client.(*APIClient); ok {
		dog.gate, dog.closeConns = c.gate, c.dialer.CloseAll
		c.gate.watchedBy(dog.failed)
	}
	return dog
}

// probe returns s.Probe, else a GET of /livez: cheap (no storage behind
// it), exempt from the API server's flow control, and sent on the
// connection the watches share, so a hung one is noticed.
func (s *APISource) probe() func(context.Context) error {
	if s.Probe != nil {
		return s.Probe
	}
	rc := s.Client.Discovery().RESTClient()
	if rc == nil || reflect.ValueOf(rc).IsNil() { // fake clientsets have none
		return func(context.Context) error {
			_, err := s.Client.Discovery().ServerVersion()
			return err
		}
	}
	return func(ctx context.Context) error {
		return rc.Get().AbsPath("/livez").MaxRetries(0).Do(ctx).Error()
	}
}

// unwrap returns the last known object of a deletion seen only on relist.
func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}
