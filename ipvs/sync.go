package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// SyncConfig shapes how the Syncer changes the kernel.
type SyncConfig struct {
	// ExcludeCIDRs: virtual servers on addresses inside them are never
	// removed (--ipvs-exclude-cidrs): someone else's.
	ExcludeCIDRs []netip.Prefix
	// DrainTimeout bounds how long a removed TCP real server keeps weight 0
	// waiting for its connections to end; 0 means 15 minutes, IPVS's own
	// timeout for an established TCP connection: past it, connections to
	// an endpoint gone from the API are dead anyway, and its address may
	// belong to a new pod.
	DrainTimeout time.Duration
	// DrainCheck is how often draining servers' connection counts are
	// read; 0 means a minute, as upstream.
	DrainCheck time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Syncer makes the kernel's IPVS table and the Helper match a Plan. It
// reads the kernel once at start and adopts what it finds (never a flush:
// IPVS keeps deleted real servers in a trash list it scans on every add).
// Afterwards a sync looks only at the service ports whose fragments
// changed, plus the keys an earlier sync failed on, and reads connection
// counts only for virtual servers with draining real servers.
//
// The order leaves no window: virtual servers and their real servers
// first, then the addresses and set elements that lead traffic to them;
// addresses and elements go before the virtual servers they led to.
type Syncer struct {
	k   ipvsnl.Kernel
	h   Helper
	cfg SyncConfig

	read bool // the kernel and helper were read
	// Desired, by owner: fragments as last synced, and for each key the
	// service ports that want it.
	frags    map[model.ServicePortName]*Fragment
	planner  *Planner // of the last plan, and its number
	planSeq  uint64
	vsOwners map[ipvsnl.ServiceKey][]vsOwner
	addrRefs map[netip.Addr]int
	// Applied: what the kernel and helper hold, as far as we know.
	have      map[ipvsnl.ServiceKey]*appliedService
	haveAddrs map[netip.Addr]bool
	// elems is, per helper set element, how many fragments want it and
	// whether the helper holds it: packed keys, because there are as many
	// elements as local endpoints.
	elems elemSet
	// Draining real servers and since when.
	draining  map[ipvsnl.ServiceKey]map[netip.AddrPort]time.Time
	nextCheck time.Time
	// Keys to look at in the next sync (changed, or failed last time).
	// Emptied maps are replaced (Sync's end): a map keeps the room of its
	// largest size, and the first sync marks everything. Dirty elements
	// are elems'.
	dirtyVS    map[ipvsnl.ServiceKey]bool
	dirtyAddrs map[netip.Addr]bool
	helperRead bool // the helper must be read again (a failed Apply)
}

// vsOwner is a service port that wants a virtual server, and its
// settings for it; most virtual servers have one.
type vsOwner struct {
	name model.ServicePortName
	v    *ipvsnl.VirtualServer
}

// elemState is what the Syncer knows of one helper set element.
type elemState struct {
	refs int32 // fragments that want it
	have bool  // the helper holds it
}

// appliedService is a virtual server as applied. Its real servers are
// ordered by address; they may be a fragment's own slice (shared once
// the kernel matched it, never written through: see shareDests).
type appliedService struct {
	svc    ipvsnl.Service
	dests  []ipvsnl.Dest
	shared bool
}

// unknownWeight marks a real server that exists with a weight we do not
// know (NEW_DEST said EEXIST): the next diff sets it.
const unknownWeight = ^uint32(0)

// SyncResult is what one sync did.
type SyncResult struct {
	Ops       int // IPVS commands sent
	Writes    int // Kernel.Apply calls
	DestReads int // virtual servers whose real servers were read (draining)
	Helper    HelperChange
	Draining  int // real servers waiting for their connections to end
}

// NewSyncer returns a Syncer over k and h; the first Sync reads both.
func NewSyncer(k ipvsnl.Kernel, h Helper, cfg SyncConfig) *Syncer {
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 15 * time.Minute
	}
	if cfg.DrainCheck == 0 {
		cfg.DrainCheck = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Syncer{k: k, h: h, cfg: cfg,
		frags: map[model.ServicePortName]*Fragment{}, vsOwners: map[ipvsnl.ServiceKey][]vsOwner{},
		addrRefs: map[netip.Addr]int{}, elems: newElemSet(),
		draining: map[ipvsnl.ServiceKey]map[netip.AddrPort]time.Time{},
		dirtyVS:  map[ipvsnl.ServiceKey]bool{}, dirtyAddrs: map[netip.Addr]bool{},
	}
}

// Sync makes the kernel match p. Failed commands are retried by the next
// sync (their keys stay dirty); the error lists them.
func (s *Syncer) Sync(p *Plan) (SyncResult, error) {
	var res SyncResult
	now := s.cfg.Now()
	if err := s.readIfNeeded(); err != nil {
		return res, err
	}
	s.updateDesired(p)

	// 1. Virtual and real servers, all but deleted services.
	step, err := s.applyServices(now, &res)
	if err != nil {
		return res, err
	}
	errs, dels, newlyDraining := step.errs, step.dels, step.newlyDraining

	// 2. Addresses and elements: added once their servers exist, removed
	// before their servers go.
	if err := s.syncHelper(step.failedNew, &res); err != nil {
		errs = append(errs, err)
		dels = nil // their addresses may still be there
	}

	// 3. Deleted virtual servers.
	opErrs, err := s.apply(dels, &res)
	if err != nil {
		return res, err
	}
	errs = append(errs, opErrs...)

	// 4. Graceful termination.
	if err := s.drain(now, newlyDraining, &res); err != nil {
		errs = append(errs, err)
	}
	for _, m := range s.draining {
		res.Draining += len(m)
	}
	s.shrinkDirty()
	return res, errors.Join(errs...)
}

// shrinkDirty replaces the dirty maps that emptied: after the first sync
// they would keep the room of every key for good.
func (s *Syncer) shrinkDirty() {
	if len(s.dirtyVS) == 0 {
		s.dirtyVS = map[ipvsnl.ServiceKey]bool{}
	}
	if len(s.dirtyAddrs) == 0 {
		s.dirtyAddrs = map[netip.Addr]bool{}
	}
	s.elems.shrink()
}

// readIfNeeded reads the kernel on the first sync, and the helper again
// after a failed Apply left it unknown.
func (s *Syncer) readIfNeeded() error {
	if !s.read {
		if err := s.readKernel(); err != nil {
			return err
		}
	}
	if s.helperRead {
		return s.readHelper()
	}
	return nil
}

// opsPerApply bounds the commands of step 1 held at once: a full sync has
// one per virtual and real server, eleven times the Services at ten
// endpoints each; the kernel gets them in batches of batchBytes either
// way.
const opsPerApply = 8192

// serviceStep is what step 1 leaves for the others.
type serviceStep struct {
	errs          []error     // commands that failed
	dels          []ipvsnl.Op // DEL_SERVICE commands, for step 3
	newlyDraining []ipvsnl.ServiceKey
	// failedNew are the addresses of virtual servers it should have
	// created and did not: they must not lead traffic yet.
	failedNew map[netip.Addr]bool
}

// applyServices brings the dirty virtual servers that stay to what is
// desired, applying the commands opsPerApply at a time, and returns the
// deletions of those that go. The error is a transport failure.
func (s *Syncer) applyServices(now time.Time, res *SyncResult) (serviceStep, error) {
	step := serviceStep{failedNew: map[netip.Addr]bool{}}
	var ops []ipvsnl.Op
	flush := func() error {
		opErrs, err := s.apply(ops, res)
		if err != nil {
			return err
		}
		step.errs = append(step.errs, opErrs...)
		for _, op := range ops {
			if op.Cmd == ipvsnl.CmdNewService && s.have[op.Service.ServiceKey] == nil {
				step.failedNew[op.Service.Addr] = true
			}
		}
		ops = ops[:0]
		return nil
	}
	for _, key := range sortedKeys(s.dirtyVS) {
		o, d, drains := s.diffService(key, now)
		if len(o) == 0 && len(d) == 0 {
			delete(s.dirtyVS, key) // matches (draining aside)
			s.shareDests(key)
		}
		ops, step.dels = append(ops, o...), append(step.dels, d...)
		if drains {
			step.newlyDraining = append(step.newlyDraining, key)
		}
		if len(ops) >= opsPerApply {
			if err := flush(); err != nil {
				return step, err
			}
		}
	}
	return step, flush()
}

// syncHelper applies the change of addresses and set elements; after a
// failure the next sync reads the helper again.
func (s *Syncer) syncHelper(failedNew map[netip.Addr]bool, res *SyncResult) error {
	change := s.diffHelper(failedNew)
	if change.empty() {
		s.elems.lookedAt()
		return nil
	}
	res.Helper = change
	if err := s.h.Apply(change); err != nil {
		s.helperRead = true
		return fmt.Errorf("kube-ipvs0 addresses and helper sets: %w", err)
	}
	s.elems.lookedAt()
	markApplied(s.haveAddrs, s.dirtyAddrs, change.AddAddrs, true)
	markApplied(s.haveAddrs, s.dirtyAddrs, change.DelAddrs, false)
	for _, e := range change.AddElems {
		s.elems.applied(e, true)
	}
	for _, e := range change.DelElems {
		s.elems.applied(e, false)
	}
	return nil
}

// markApplied records keys as held (or not) and no longer dirty.
func markApplied[K comparable](have, dirty map[K]bool, keys []K, held bool) {
	for _, k := range keys {
		if held {
			have[k] = true
		} else {
			delete(have, k)
		}
		delete(dirty, k)
	}
}

// NextDrainCheck is when a sync next reads draining servers' counts (zero
// when none drain): the loop should sync by then.
func (s *Syncer) NextDrainCheck() time.Time {
	if len(s.draining) == 0 {
		return time.Time{}
	}
	return s.nextCheck
}

func (s *Syncer) readKernel() error {
	vss, err := s.k.Read()
	if err != nil {
		return fmt.Errorf("reading IPVS services: %w", err)
	}
	s.adoptIPVS(vss)
	// Drain entries for servers that are gone are dropped by the diff;
	// after a restart the diff finds weight-0 leftovers and drains them.
	if err := s.readHelper(); err != nil {
		return err
	}
	s.read = true
	return nil
}

// adoptIPVS takes vss as what the kernel holds and marks every key, held
// or wanted, for the next diff.
func (s *Syncer) adoptIPVS(vss []ipvsnl.VirtualServer) {
	s.have = make(map[ipvsnl.ServiceKey]*appliedService, len(vss))
	for _, v := range vss {
		a := &appliedService{svc: v.Service}
		for _, d := range v.Dests {
			a.setDest(d)
		}
		s.have[v.ServiceKey] = a
		s.dirtyVS[v.ServiceKey] = true
	}
	for k := range s.vsOwners {
		s.dirtyVS[k] = true
	}
}

func (s *Syncer) readHelper() error {
	addrs, elems, err := s.h.Read()
	if err != nil {
		return fmt.Errorf("reading kube-ipvs0 addresses and helper sets: %w", err)
	}
	s.haveAddrs = map[netip.Addr]bool{}
	for _, a := range addrs {
		s.haveAddrs[a] = true
		s.dirtyAddrs[a] = true
	}
	s.elems.readBack(elems)
	for a := range s.addrRefs {
		s.dirtyAddrs[a] = true
	}
	s.helperRead = false
	return nil
}

// updateDesired swaps in the fragments that changed, marking what they
// touch. After the plan of the same Planner that came before it, only the
// service ports it names as changed are looked at; otherwise an unchanged
// fragment costs a pointer comparison.
func (s *Syncer) updateDesired(p *Plan) {
	defer func() { s.planner, s.planSeq = p.planner, p.seq }()
	if p.planner != nil && p.planner == s.planner && p.prevSeq != 0 && p.prevSeq == s.planSeq {
		for _, name := range p.changed {
			s.updateFragment(name, p.Services[name])
		}
		return
	}
	for name := range s.frags {
		if _, ok := p.Services[name]; !ok {
			s.updateFragment(name, nil)
		}
	}
	for name, fr := range p.Services {
		s.updateFragment(name, fr)
	}
}

// updateFragment makes fr (nil: none) name's wanted fragment.
func (s *Syncer) updateFragment(name model.ServicePortName, fr *Fragment) {
	old := s.frags[name]
	switch {
	case old == fr:
	case old.Equal(fr):
		s.frags[name] = fr
	default:
		if old != nil {
			s.unown(name, old)
		}
		if fr == nil {
			delete(s.frags, name)
			return
		}
		s.own(name, fr)
		s.frags[name] = fr
	}
}

func (s *Syncer) own(name model.ServicePortName, fr *Fragment) {
	for i := range fr.Virtual {
		v := &fr.Virtual[i]
		owners := s.vsOwners[v.ServiceKey]
		if i := slices.IndexFunc(owners, func(o vsOwner) bool { return o.name == name }); i >= 0 {
			owners[i].v = v
		} else {
			s.vsOwners[v.ServiceKey] = append(owners, vsOwner{name: name, v: v})
		}
		s.dirtyVS[v.ServiceKey] = true
	}
	for _, a := range fr.Addrs {
		s.addrRefs[a]++
		s.dirtyAddrs[a] = true
	}
	s.elems.own(fr.elems, 1)
}

func (s *Syncer) unown(name model.ServicePortName, fr *Fragment) {
	for _, v := range fr.Virtual {
		owners := slices.DeleteFunc(s.vsOwners[v.ServiceKey], func(o vsOwner) bool { return o.name == name })
		if len(owners) == 0 {
			delete(s.vsOwners, v.ServiceKey)
		} else {
			s.vsOwners[v.ServiceKey] = owners
		}
		s.dirtyVS[v.ServiceKey] = true
	}
	for _, a := range fr.Addrs {
		if s.addrRefs[a]--; s.addrRefs[a] <= 0 {
			delete(s.addrRefs, a)
		}
		s.dirtyAddrs[a] = true
	}
	s.elems.own(fr.elems, -1)
}

// want is the virtual server wanted at key: the first owner's by name
// when two service ports claim it (the same external IP and port).
func (s *Syncer) want(key ipvsnl.ServiceKey) *ipvsnl.VirtualServer {
	owners := s.vsOwners[key]
	if len(owners) == 1 {
		return owners[0].v
	}
	var best *ipvsnl.VirtualServer
	var bestName string
	for _, o := range owners {
		if n := o.name.String(); best == nil || n < bestName {
			best, bestName = o.v, n
		}
	}
	return best
}

func (s *Syncer) excluded(a netip.Addr) bool {
	return slices.ContainsFunc(s.cfg.ExcludeCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

// diffService returns the ops that make key's virtual server match: ops
// for step 1, dels (DEL_SERVICE) for step 3, and whether a real server
// started draining.
func (s *Syncer) diffService(key ipvsnl.ServiceKey, now time.Time) (ops, dels []ipvsnl.Op, drains bool) {
	want, have := s.want(key), s.have[key]
	switch {
	case want == nil && have == nil:
		delete(s.dirtyVS, key)
		return nil, nil, false
	case want == nil:
		if s.excluded(key.Addr) {
			delete(s.dirtyVS, key)
			return nil, nil, false
		}
		return nil, []ipvsnl.Op{{Cmd: ipvsnl.CmdDelService, Service: have.svc}}, false
	case have == nil:
		ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewService, Service: want.Service})
		for _, d := range want.Dests {
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewDest, Service: want.Service, Dest: d})
		}
		return ops, nil, false
	}
	if !have.svc.SameSettings(want.Service) {
		ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdSetService, Service: want.Service})
	}
	for _, d := range want.Dests {
		h, ok := have.dest(d.Addr)
		switch {
		case !ok:
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewDest, Service: want.Service, Dest: d})
		case h.Weight != d.Weight || h.Fwd != d.Fwd:
			// Also an endpoint back from draining: it keeps its
			// connections and gets its weight back.
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdSetDest, Service: want.Service, Dest: d})
		}
		s.stopDraining(key, d.Addr)
	}
	for _, h := range have.dests {
		addr := h.Addr
		if hasDest(want.Dests, addr) {
			continue
		}
		if key.Protocol != model.TCP {
			// No connection state to wait for: UDP and SCTP clients
			// would keep sending to a dead server.
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdDelDest, Service: want.Service, Dest: h})
			continue
		}
		if h.Weight != 0 {
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdSetDest, Service: want.Service, Dest: ipvsnl.Dest{Addr: addr, Fwd: h.Fwd & ipvsnl.FwdMask}})
		}
		if _, ok := s.draining[key][addr]; !ok {
			if s.draining[key] == nil {
				s.draining[key] = map[netip.AddrPort]time.Time{}
			}
			s.draining[key][addr] = now
			drains = true
		}
	}
	return ops, nil, drains
}

func (s *Syncer) stopDraining(key ipvsnl.ServiceKey, addr netip.AddrPort) {
	if m := s.draining[key]; m != nil {
		delete(m, addr)
		if len(m) == 0 {
			delete(s.draining, key)
		}
	}
}

// record updates the applied view after op's result; false when op failed
// in a way that leaves work for the next sync.
func (s *Syncer) record(op ipvsnl.Op, err error) bool {
	key := op.Service.ServiceKey
	have := s.have[key]
	switch {
	case err == nil:
	case errors.Is(err, syscall.ESRCH): // the service is not there
		delete(s.have, key)
		delete(s.draining, key)
		return op.Cmd == ipvsnl.CmdDelService
	case errors.Is(err, syscall.ENOENT) && op.Cmd == ipvsnl.CmdDelDest:
	case errors.Is(err, syscall.ENOENT) && op.Cmd == ipvsnl.CmdSetDest && have != nil:
		have.delDest(op.Dest.Addr)
		s.stopDraining(key, op.Dest.Addr)
		return false
	case errors.Is(err, syscall.EEXIST) && op.Cmd == ipvsnl.CmdNewDest && have != nil:
		have.setDest(ipvsnl.Dest{Addr: op.Dest.Addr, Weight: unknownWeight})
		return false
	case errors.Is(err, syscall.EEXIST) && op.Cmd == ipvsnl.CmdNewService:
		s.read = false // someone else made it: read everything again
		return false
	default:
		return false
	}
	switch op.Cmd {
	case ipvsnl.CmdNewService:
		s.have[key] = &appliedService{svc: op.Service}
	case ipvsnl.CmdSetService:
		if have != nil {
			have.svc = op.Service
		}
	case ipvsnl.CmdDelService:
		delete(s.have, key)
		delete(s.draining, key)
	case ipvsnl.CmdNewDest, ipvsnl.CmdSetDest:
		if have != nil {
			have.setDest(ipvsnl.Dest{Addr: op.Dest.Addr, Weight: op.Dest.Weight, Fwd: op.Dest.Fwd})
		}
	case ipvsnl.CmdDelDest:
		if have != nil {
			have.delDest(op.Dest.Addr)
		}
		s.stopDraining(key, op.Dest.Addr)
	}
	return true
}

// converged reports whether key's applied state is what is wanted (up to
// draining real servers, which the drain step handles).
func (s *Syncer) converged(key ipvsnl.ServiceKey) bool {
	want, have := s.want(key), s.have[key]
	if want == nil || have == nil {
		return want == nil && have == nil
	}
	if !have.svc.SameSettings(want.Service) {
		return false
	}
	for _, d := range want.Dests {
		h, ok := have.dest(d.Addr)
		if !ok || h.Weight != d.Weight || h.Fwd != d.Fwd {
			return false
		}
	}
	if len(have.dests) == len(want.Dests) {
		return true // every real server held is wanted
	}
	for _, h := range have.dests {
		if _, drain := s.draining[key][h.Addr]; !hasDest(want.Dests, h.Addr) && (!drain || h.Weight != 0) {
			return false
		}
	}
	return true
}

// shareDests lets a converged virtual server's applied real servers be the
// wanted ones, when they are equal: one copy of each real server, not
// two (it is copied again before a change).
func (s *Syncer) shareDests(key ipvsnl.ServiceKey) {
	want, have := s.want(key), s.have[key]
	if want != nil && have != nil && !have.shared && slices.Equal(have.dests, want.Dests) {
		have.dests, have.shared = want.Dests, true
	}
}

// dest is the applied real server at addr.
func (a *appliedService) dest(addr netip.AddrPort) (ipvsnl.Dest, bool) {
	i, ok := slices.BinarySearchFunc(a.dests, addr, compareDestAddr)
	if !ok {
		return ipvsnl.Dest{}, false
	}
	return a.dests[i], true
}

// setDest records d, in place of the real server at its address.
func (a *appliedService) setDest(d ipvsnl.Dest) {
	a.unshare()
	i, ok := slices.BinarySearchFunc(a.dests, d.Addr, compareDestAddr)
	if ok {
		a.dests[i] = d
	} else {
		a.dests = slices.Insert(a.dests, i, d)
	}
}

// delDest forgets the real server at addr.
func (a *appliedService) delDest(addr netip.AddrPort) {
	if i, ok := slices.BinarySearchFunc(a.dests, addr, compareDestAddr); ok {
		a.unshare()
		a.dests = slices.Delete(a.dests, i, i+1)
	}
}

// unshare copies real servers shared with a fragment before a change.
func (a *appliedService) unshare() {
	if a.shared {
		a.dests, a.shared = slices.Clone(a.dests), false
	}
}

func compareDestAddr(d ipvsnl.Dest, addr netip.AddrPort) int { return d.Addr.Compare(addr) }

// hasDest reports whether ds, ordered by address as a VirtualServer's
// real servers are, holds one at addr.
func hasDest(ds []ipvsnl.Dest, addr netip.AddrPort) bool {
	_, ok := slices.BinarySearchFunc(ds, addr, compareDestAddr)
	return ok
}

// diffHelper returns the address and element changes of the dirty keys,
// leaving out addresses whose virtual server could not be created.
func (s *Syncer) diffHelper(failedNew map[netip.Addr]bool) HelperChange {
	var c HelperChange
	for a := range s.dirtyAddrs {
		switch want, have := s.addrRefs[a] > 0, s.haveAddrs[a]; {
		case want && !have && !failedNew[a]:
			c.AddAddrs = append(c.AddAddrs, a)
		case !want && have:
			c.DelAddrs = append(c.DelAddrs, a)
		case want == have:
			delete(s.dirtyAddrs, a)
		}
	}
	s.elems.diff(&c)
	for _, l := range [][]netip.Addr{c.AddAddrs, c.DelAddrs} {
		slices.SortFunc(l, netip.Addr.Compare)
	}
	slices.SortFunc(c.AddElems, compareElements)
	slices.SortFunc(c.DelElems, compareElements)
	return c
}

// diffElem adds the change an element needs, if any, and reports whether
// it needs none.
func diffElem[K packed](c *HelperChange, k K, st elemState) bool {
	switch {
	case st.refs > 0 && !st.have:
		c.AddElems = append(c.AddElems, k.element())
	case st.refs <= 0 && st.have:
		c.DelElems = append(c.DelElems, k.element())
	default:
		return true
	}
	return false
}

// drain deletes draining real servers whose connections are gone or whose
// time is up, reading counts of the virtual servers that just started
// draining and, every DrainCheck, of all that drain.
func (s *Syncer) drain(now time.Time, fresh []ipvsnl.ServiceKey, res *SyncResult) error {
	check := fresh
	if !now.Before(s.nextCheck) {
		check = slices.SortedFunc(maps.Keys(s.draining), ipvsnl.ServiceKey.Compare)
		s.nextCheck = now.Add(s.cfg.DrainCheck)
	}
	var ops []ipvsnl.Op
	var errs []error
	for _, key := range slices.Compact(check) {
		m := s.draining[key]
		have := s.have[key]
		if len(m) == 0 || have == nil {
			continue
		}
		res.DestReads++
		dests, err := s.k.Dests(key)
		if errors.Is(err, syscall.ESRCH) {
			delete(s.have, key)
			delete(s.draining, key)
			s.dirtyVS[key] = true
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the real servers of %s: %w", key, err))
			continue
		}
		conns := make(map[netip.AddrPort]uint32, len(dests))
		for _, d := range dests {
			conns[d.Addr] = d.Active + d.Inactive
		}
		for _, addr := range slices.SortedFunc(maps.Keys(m), netip.AddrPort.Compare) {
			n, ok := conns[addr]
			switch {
			case !ok:
				have.delDest(addr)
				s.stopDraining(key, addr)
			case n == 0 || now.Sub(m[addr]) >= s.cfg.DrainTimeout:
				ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdDelDest, Service: have.svc, Dest: ipvsnl.Dest{Addr: addr}})
			}
		}
	}
	opErrs, err := s.apply(ops, res)
	if err != nil {
		return err
	}
	errs = append(errs, opErrs...)
	return errors.Join(errs...)
}

// apply sends ops, records each result, and marks clean the keys they
// touched that converged. The error is a transport failure (everything is
// read again next time); failed ops come back in errs.
func (s *Syncer) apply(ops []ipvsnl.Op, res *SyncResult) (errs []error, err error) {
	if len(ops) == 0 {
		return nil, nil
	}
	res.Ops += len(ops)
	res.Writes++
	opErrs, err := s.k.Apply(ops)
	if err != nil {
		s.read = false
		return nil, err
	}
	touched := map[ipvsnl.ServiceKey]bool{}
	for i, op := range ops {
		var e error
		if opErrs != nil {
			e = opErrs[i]
		}
		if s.record(op, e) {
			touched[op.Service.ServiceKey] = true
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", op, e))
		}
	}
	for key := range touched {
		if s.dirtyVS[key] && s.converged(key) {
			delete(s.dirtyVS, key)
			s.shareDests(key)
		}
	}
	return errs, nil
}

func sortedKeys(m map[ipvsnl.ServiceKey]bool) []ipvsnl.ServiceKey {
	return slices.SortedFunc(maps.Keys(m), ipvsnl.ServiceKey.Compare)
}
