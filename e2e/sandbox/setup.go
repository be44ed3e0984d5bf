package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// setup builds the topology. Each namespace is recorded before it is
// created, so that Close removes whatever a failed setup left.
func (s *Sandbox) setup(ctx context.Context) error {
	for _, ns := range s.Namespaces() {
		// Recorded first: a killed `ip netns add` may have created it.
		s.mu.Lock()
		s.namespaces = append(s.namespaces, ns)
		s.mu.Unlock()
		if err := s.ip(ctx, "netns", "add", s.prefix+ns); err != nil {
			return err
		}

		// Before any link exists, so that every link inherits it: no
		// duplicate address detection, addresses are usable at once.
		sysctls := []string{
			"net.ipv6.conf.all.accept_dad=0",
			"net.ipv6.conf.default.accept_dad=0",
		}
		if ns == Node {
			sysctls = append(sysctls,
				"net.ipv4.ip_forward=1",
				"net.ipv6.conf.all.forwarding=1",
			)
		}
		if _, err := s.Exec(ctx, ns, append([]string{"sysctl", "-q", "-w"}, sysctls...)...); err != nil {
			return err
		}
		if err := s.ipIn(ctx, ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	// Bridged pod traffic goes through the node's nftables hooks, as on a
	// real node (kubeadm requires it). Where br_netfilter is a module
	// that is not loaded the keys do not exist: go without.
	if _, err := s.Exec(ctx, Node, "sysctl", "-q", "-w",
		"net.bridge.bridge-nf-call-iptables=1",
		"net.bridge.bridge-nf-call-ip6tables=1"); err != nil {
		s.logf("sandbox %s: no br_netfilter, bridged traffic bypasses nftables: %v", s.prefix, err)
	}

	// The node: the pod bridge and the veth towards the client.
	steps := [][]string{
		{"link", "add", Bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"addr", "add", BridgeIPv4.String(), "dev", Bridge},
		{"addr", "add", BridgeIPv6.String(), "dev", Bridge, "nodad"},
		{"link", "set", Bridge, "up"},
		{"link", "add", NodeExtDev, "type", "veth", "peer", "name", PodDev, "netns", s.prefix + Client},
		{"addr", "add", NodeIPv4.String(), "dev", NodeExtDev},
		{"addr", "add", NodeIPv6.String(), "dev", NodeExtDev, "nodad"},
		{"link", "set", NodeExtDev, "up"},
	}
	for i, p := range s.pods {
		veth := hostVeth(p.Name, i)
		steps = append(steps,
			[]string{"link", "add", veth, "type", "veth", "peer", "name", PodDev, "netns", s.prefix + p.Name},
			[]string{"link", "set", veth, "master", Bridge, "up"},
			// As kubelet and the bridge CNI plugin do: with
			// br_netfilter, a pod's packet DNATed back to that
			// pod is bridged out of the port it came in on.
			[]string{"link", "set", veth, "type", "bridge_slave", "hairpin", "on"},
		)
	}
	for _, step := range steps {
		if err := s.ipIn(ctx, Node, step...); err != nil {
			return err
		}
	}

	// The pods: addresses and default routes via the bridge.
	for _, p := range s.pods {
		steps := [][]string{
			{"addr", "add", netip.PrefixFrom(p.IPv4, BridgeIPv4.Bits()).String(), "dev", PodDev},
			{"link", "set", PodDev, "up"},
			{"route", "add", "default", "via", BridgeIPv4.Addr().String(), "dev", PodDev},
		}
		if p.IPv6.IsValid() {
			steps = append(steps,
				[]string{"addr", "add", netip.PrefixFrom(p.IPv6, BridgeIPv6.Bits()).String(), "dev", PodDev, "nodad"},
				[]string{"route", "add", "default", "via", BridgeIPv6.Addr().String(), "dev", PodDev},
			)
		}
		for _, step := range steps {
			if err := s.ipIn(ctx, p.Name, step...); err != nil {
				return err
			}
		}
	}

	// The client: routes to Service and pod networks via the node.
	steps = [][]string{
		{"addr", "add", ClientIPv4.String(), "dev", PodDev},
		{"addr", "add", ClientIPv6.String(), "dev", PodDev, "nodad"},
		{"link", "set", PodDev, "up"},
	}
	for _, cidr := range append(slices.Clone(ServiceCIDRs), ClusterCIDRs...) {
		via := NodeIPv4.Addr()
		if cidr.Addr().Is6() {
			via = NodeIPv6.Addr()
		}
		steps = append(steps, []string{"route", "add", cidr.String(), "via", via.String(), "dev", PodDev})
	}
	for _, step := range steps {
		if err := s.ipIn(ctx, Client, step...); err != nil {
			return err
		}
	}

	return Poll(ctx, s.opts.ReadyTimeout, 20*time.Millisecond, s.ready)
}

// wantAddrs lists, per namespace and link, the addresses setup assigns.
func (s *Sandbox) wantAddrs() map[string]map[string][]netip.Addr {
	want := map[string]map[string][]netip.Addr{
		Node: {
			Bridge:     {BridgeIPv4.Addr(), BridgeIPv6.Addr()},
			NodeExtDev: {NodeIPv4.Addr(), NodeIPv6.Addr()},
		},
		Client: {PodDev: {ClientIPv4.Addr(), ClientIPv6.Addr()}},
	}
	for i, p := range s.pods {
		want[Node][hostVeth(p.Name, i)] = nil
		addrs := []netip.Addr{p.IPv4}
		if p.IPv6.IsValid() {
			addrs = append(addrs, p.IPv6)
		}
		want[p.Name] = map[string][]netip.Addr{PodDev: addrs}
	}
	return want
}

// ipLink is the part of `ip -j -d addr show` that ready looks at.
type ipLink struct {
	Name      string `json:"ifname"`
	OperState string `json:"operstate"`
	Master    string `json:"master"`
	LinkInfo  struct {
		SlaveData struct {
			State string `json:"state"`
		} `json:"info_slave_data"`
	} `json:"linkinfo"`
	AddrInfo []ipAddr `json:"addr_info"`
}

type ipAddr struct {
	Local     string `json:"local"`
	Tentative bool   `json:"tentative"`
	DADFailed bool   `json:"dadfailed"`
}

// ready reports, as an error, the first thing not yet up: a link not UP, a
// bridge port not forwarding, an address missing or tentative.
func (s *Sandbox) ready(ctx context.Context) error {
	for ns, links := range s.wantAddrs() {
		out, err := s.ipJSON(ctx, ns, "-d", "addr", "show")
		if err != nil {
			return err
		}
		var got []ipLink
		if err := json.Unmarshal(out, &got); err != nil {
			return fmt.Errorf("%s: parse ip -j addr show: %w", ns, err)
		}
		for name, addrs := range links {
			i := slices.IndexFunc(got, func(l ipLink) bool { return l.Name == name })
			if i < 0 {
				return fmt.Errorf("%s: no link %s", ns, name)
			}
			l := got[i]
			// A bridge without ports has no carrier.
			if l.OperState != "UP" && !(name == Bridge && len(s.pods) == 0) {
				return fmt.Errorf("%s: link %s is %s", ns, name, l.OperState)
			}
			if l.Master != "" && l.LinkInfo.SlaveData.State != "forwarding" {
				return fmt.Errorf("%s: bridge port %s is %s", ns, name, l.LinkInfo.SlaveData.State)
			}
			for _, a := range l.AddrInfo {
				if a.DADFailed {
					return fmt.Errorf("%s: %s: duplicate address detection failed for %s", ns, name, a.Local)
				}
				if a.Tentative {
					return fmt.Errorf("%s: %s: address %s is tentative", ns, name, a.Local)
				}
			}
			for _, want := range addrs {
				if !slices.ContainsFunc(l.AddrInfo, func(a ipAddr) bool { return a.Local == want.String() }) {
					return fmt.Errorf("%s: %s has no address %s", ns, name, want)
				}
			}
		}
	}
	return nil
}

// Poll calls cond every interval until it returns nil and then returns nil.
// If timeout passes or ctx ends first, it returns an error wrapping cond's
// last error. cond gets a context that ends with the timeout.
func Poll(ctx context.Context, timeout, interval time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		// An error caused by the timeout itself says less than the
		// one before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w", time.Since(start).Round(time.Millisecond), last)
		case <-t.C:
		}
	}
}
