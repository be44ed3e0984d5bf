package nft

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Backend is the nftables backend: it turns each State into a Ruleset and
// makes the kernel match it with one transaction per sync.
type Backend struct {
	cfg Config
	k   *Kernel
	log *slog.Logger

	// applied is what the kernel holds since the last successful sync.
	applied map[Family]*Table
	// inputs are what each applied fragment was built from, so that an
	// unchanged service port reuses its fragment and the diff skips it.
	inputs map[proxier.ServicePortName]fragmentInput
	node   proxier.Node
	// pending are chains flushed by the last transaction, to delete in the next.
	pending  map[Family][]string
	needFull bool
}

type fragmentInput struct {
	svc *proxier.ServicePort
	eps []proxier.Endpoint
}

var _ proxier.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs through k.
func NewBackend(cfg Config, k *Kernel, log *slog.Logger) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{cfg: cfg, k: k, log: log, needFull: true, pending: map[Family][]string{}}, nil
}

// ForceFull makes the next sync rewrite everything (e.g. after a drift check).
func (b *Backend) ForceFull() { b.needFull = true }

// Sync programs st. The first sync and the one after a failure rewrite the
// whole table; the others send only what changed.
func (b *Backend) Sync(ctx context.Context, st *proxier.State) (proxier.SyncResult, error) {
	if err := ctx.Err(); err != nil {
		return proxier.SyncResult{}, err
	}
	full := b.needFull || b.applied == nil
	reuse := !full && b.node.Equal(st.Node)
	want := map[Family]*Table{}
	for _, f := range []Family{IPv4, IPv6} {
		t := BuildTable(f, b.cfg)
		for name, svc := range st.Services {
			eps := st.Endpoints[name]
			if in, ok := b.inputs[name]; reuse && ok && in.svc.Equal(svc) && proxier.EndpointsEqual(in.eps, eps) {
				if fr := b.applied[f].Services[name]; fr != nil {
					t.Services[name] = fr
				}
				continue
			}
			if fr := BuildFragment(f, b.cfg, st.Node, svc, eps); fr != nil {
				t.Services[name] = fr
			}
		}
		want[f] = t
	}

	bt := b.k.newBatch()
	stale := map[Family][]string{}
	var setID uint32
	changed := false
	for _, f := range []Family{IPv4, IPv6} {
		var x *tx
		if full {
			have, err := b.kernelTable(f)
			if err != nil {
				return proxier.SyncResult{}, err
			}
			x, stale[f] = fullTx(want[f], have)
		} else {
			x, stale[f] = diffTx(b.applied[f], want[f], b.pending[f])
		}
		if !x.empty() {
			changed = true
			x.write(bt, &setID)
		}
	}
	res := proxier.SyncResult{Full: full, Changed: changed, Messages: bt.messages()}
	if changed {
		res.Bytes = bt.size()
		start := time.Now()
		err := b.k.Apply(bt)
		res.Kernel = time.Since(start)
		b.k.finished(bt)
		if err != nil {
			b.needFull = true
			return res, fmt.Errorf("applying nftables generation: %w", err)
		}
	}
	b.applied = want
	b.pending = stale
	b.needFull = false
	b.node = st.Node
	b.inputs = make(map[proxier.ServicePortName]fragmentInput, len(st.Services))
	for name, svc := range st.Services {
		b.inputs[name] = fragmentInput{svc: svc, eps: st.Endpoints[name]}
	}
	return res, nil
}

func (b *Backend) kernelTable(f Family) (kernelTable, error) {
	chains, maps, ok, err := b.k.existing(f, b.cfg.TableName)
	if err != nil {
		return kernelTable{}, err
	}
	return kernelTable{exists: ok, chains: chains, maps: maps}, nil
}

// Cleanup deletes our tables, both families, in one transaction.
func (b *Backend) Cleanup(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	bt := b.k.newBatch()
	for _, f := range []Family{IPv4, IPv6} {
		have, err := b.kernelTable(f)
		if err != nil {
			return false, err
		}
		if have.exists {
			bt.delTable(f, b.cfg.TableName)
		}
	}
	if bt.messages() == 0 {
		return false, nil
	}
	err := b.k.Apply(bt)
	b.k.finished(bt)
	if err != nil {
		return false, fmt.Errorf("deleting tables: %w", err)
	}
	b.applied, b.inputs, b.needFull = nil, nil, true
	return true, nil
}
