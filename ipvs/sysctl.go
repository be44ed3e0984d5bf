package ipvs

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// Sysctl is one kernel setting IPVS mode needs.
type Sysctl struct {
	Key   string
	Value int
	Why   string
}

// Sysctls are the settings upstream's IPVS mode makes: connection tracking
// of IPVS connections (masquerade needs it), expiry of connections to
// deleted real servers and of persistence templates to quiesced ones,
// forwarding, and with strictARP the ARP settings that keep the node from
// answering ARP for kube-ipvs0's addresses on other interfaces.
func Sysctls(strictARP bool) []Sysctl {
	out := []Sysctl{
		{"net/ipv4/vs/conntrack", 1, "IPVS connections must be tracked for masquerading"},
		{"net/ipv4/vs/expire_nodest_conn", 1, "drop connections to deleted real servers at their next packet"},
		{"net/ipv4/vs/expire_quiescent_template", 1, "expire persistence to real servers with weight 0"},
		{"net/ipv4/ip_forward", 1, "forward traffic to endpoints on other nodes"},
	}
	if strictARP {
		out = append(out,
			Sysctl{"net/ipv4/conf/all/arp_ignore", 1, "--ipvs-strict-arp: answer ARP only for addresses of the receiving interface"},
			Sysctl{"net/ipv4/conf/all/arp_announce", 2, "--ipvs-strict-arp: announce the best local address for the target"})
	}
	return out
}

// ApplySysctls writes each of Sysctls(strictARP) that differs, through s,
// logging what it changed. Every failure is returned, joined.
func ApplySysctls(s *sysctl.Sysctl, strictARP bool, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	for _, c := range Sysctls(strictARP) {
		was, err := s.GetInt(c.Key)
		if err == nil && was == c.Value {
			continue
		}
		if err := s.SetInt(c.Key, c.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", c.Key, c.Why, err))
			continue
		}
		log.Info("sysctl set for IPVS mode", "key", c.Key, "value", c.Value, "was", was)
	}
	return errors.Join(errs...)
}
