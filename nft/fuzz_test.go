package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// fuzzReader hands out fuzzed bytes as small values; zeros once exhausted.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) u16() uint16 { return uint16(r.byte())<<8 | uint16(r.byte()) }

// str is a name of up to 70 bytes: fuzzed bytes, with some turned into
// multi-byte runes so that long unicode names are common.
func (r *fuzzReader) str() string {
	n := int(r.byte() % 71)
	var b strings.Builder
	for i := 0; i < n; i++ {
		c := r.byte()
		if c >= 0xf0 {
			b.WriteString("ñ服")
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func (r *fuzzReader) addr() netip.Addr {
	if r.byte()%3 == 0 {
		var a [16]byte
		a[0], a[1], a[14], a[15] = 0xfd, 0, r.byte(), r.byte()
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{10, r.byte(), r.byte(), r.byte()})
}

// fuzzState builds a State of up to 8 service ports from fuzzed bytes.
func fuzzState(data []byte) *model.State {
	r := &fuzzReader{b: data}
	st := model.NewState()
	st.Node = model.Node{Name: "node-1", IPs: []netip.Addr{r.addr()}}
	for i, n := 0, int(r.byte()%9); i < n; i++ {
		name := model.ServicePortName{Namespace: r.str(), Name: r.str(), Port: r.str()}
		flags := r.byte()
		svc := &model.ServicePort{Name: name, Protocol: []model.Protocol{model.TCP, model.UDP, model.SCTP}[flags%3],
			Port: r.u16(), ClusterIPs: []netip.Addr{r.addr(), r.addr()},
			ExternalPolicyLocal: flags&8 != 0, InternalPolicyLocal: flags&16 != 0}
		if flags&4 != 0 {
			svc.NodePort = 30000 + r.u16()%2768
		}
		if flags&32 != 0 {
			svc.ExternalIPs = []netip.Addr{r.addr()}
			svc.LoadBalancerIPs = []netip.Addr{r.addr()}
			svc.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(r.addr(), 8).Masked()}
		}
		if flags&64 != 0 {
			svc.AffinityTimeout = time.Duration(r.byte()+1) * time.Second
		}
		st.Services = st.Services.With(name, svc)
		for j, m := 0, int(r.byte()%7); j < m; j++ {
			ef := r.byte()
			node := "node-1"
			if ef&1 != 0 {
				node = "node-2"
			}
			st.Endpoints = st.Endpoints.With(name, append(st.Endpoints.Get(name), model.Endpoint{Addr: r.addr(), Port: r.u16(), NodeName: node,
				Ready: ef&2 == 0, Serving: ef&4 == 0, Terminating: ef&8 != 0}))
		}
	}
	return st
}

// FuzzBuildEncode drives State -> Ruleset -> render and netlink: no panic,
// every comment within nft's limit and every chain a verdict names exists.
// (That the encoding is well-formed netlink is nftlib's FuzzTxEncode.)
func FuzzBuildEncode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st := fuzzState(data)
		rs := Build(st, demoConfig())
		checkComments(t, rs.String())
		var unsent nftlib.Kernel // encodes, sends nothing
		bt := unsent.NewTx()
		defer unsent.DiscardTx(bt)
		var setID uint32
		for _, tb := range rs.Tables {
			checkReferences(t, tb)
			x, _ := nftlib.FullTx(tb, &nftlib.KernelTable{}, false)
			x.Write(bt, &setID)
		}
	})
}

func checkComments(t *testing.T, text string) {
	t.Helper()
	for _, part := range strings.Split(text, `comment "`)[1:] {
		c, _, ok := strings.Cut(part, `"`)
		if !ok || len(c) > 128 || !utf8.ValidString(c) || strings.ContainsAny(c, "\\\n") {
			t.Fatalf("comment nft would refuse or misread: %q", c)
		}
	}
}

func checkReferences(t *testing.T, tb *nftlib.Table) {
	t.Helper()
	exists := map[string]bool{}
	tb.EachChain(func(c *nftlib.Chain) {
		if exists[c.Name] {
			t.Fatalf("chain %s defined twice in %s", c.Name, tb.Name)
		}
		exists[c.Name] = true
	})
	need := func(chain, where string) {
		if chain != "" && !exists[chain] {
			t.Fatalf("%s refers to chain %s, not in table %s", where, chain, tb.Name)
		}
	}
	tb.EachChain(func(c *nftlib.Chain) {
		for _, r := range c.Rules {
			for _, term := range r.Terms {
				if v, ok := term.(nftlib.Verdict); ok {
					need(v.Chain, "a rule of "+c.Name)
				}
			}
		}
	})
	for _, m := range tb.Maps {
		for _, e := range tb.Elements(m.Name) {
			need(e.Verdict.Chain, "an element of "+m.Name)
		}
	}
}
