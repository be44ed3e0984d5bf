// Package kube turns Kubernetes Services, EndpointSlices and the Node into
// the proxy's model (model.State). The conversion of one object is pure
// (ServicePorts, EndpointsForService, NodeInfo); a Builder keeps the current
// objects, resolves the values Services contend for (NodePorts, external and
// load balancer IPs) and hands out State snapshots. The sources
// (source/apisource, source/filesource) feed a Builder.
package kube

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Labels that make kube-proxy look away from an object: it selects Services
// and EndpointSlices with neither of them.
const (
	// LabelServiceProxyName hands a Service to another proxy implementation.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks the EndpointSlices of headless Services.
	LabelHeadless = "service.kubernetes.io/headless"
)

// ObjectError is one problem with one Kubernetes object. Kind is lower case
// ("service", "endpointslice", "node") so messages read
// `service default/web: port "http": ...`.
type ObjectError struct {
	Kind, Namespace, Name string
	Err                   error
}

func (e *ObjectError) Error() string {
	return e.Kind + " " + ObjectName(e.Namespace, e.Name) + ": " + e.Err.Error()
}

func (e *ObjectError) Unwrap() error { return e.Err }

// ObjectName is namespace/name, or name alone for a cluster-scoped object.
func ObjectName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// NamespaceOrDefault applies what kubectl applies to a manifest without a
// namespace, so hand-written files key the same way API objects do.
func NamespaceOrDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

// problems collects ObjectErrors for one object.
type problems struct {
	kind, namespace, name string
	errs                  []error
}

func (p *problems) add(format string, args ...any) {
	p.errs = append(p.errs, &ObjectError{
		Kind: p.kind, Namespace: p.namespace, Name: p.name,
		Err: fmt.Errorf(format, args...),
	})
}

// err joins the problems; each line of its message names the object.
func (p *problems) err() error { return errors.Join(p.errs...) }

// SplitErrors undoes errors.Join one level, so callers can list the
// individual problems a conversion function returned.
func SplitErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// parseIP parses an address the way the API server has let them in over
// the years: IPv4 with leading zeros (read as decimal) is accepted for
// objects created before validation tightened, and IPv4-mapped IPv6 is
// treated as the IPv4 address it carries.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		legacy, ok := parseLegacyIPv4(s)
		if !ok {
			return netip.Addr{}, fmt.Errorf("invalid IP address %q", s)
		}
		a = legacy
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q: zones are not allowed", s)
	}
	a = a.Unmap()
	if a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q: unspecified address", s)
	}
	return a, nil
}

// notForTraffic says why an address cannot be a Service's or an
// endpoint's ("" if it can): traffic to it never leaves the node, or is not
// for one host. 0.0.0.0 and :: are already refused by parseIP.
func notForTraffic(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	return ""
}

// notForEndpoint is notForTraffic for an endpoint or an external IP, which
// the API server also refuses in the link-local range: such addresses are
// the node's own (a cloud's metadata service at 169.254.169.254).
func notForEndpoint(a netip.Addr) string {
	if a.IsLinkLocalUnicast() {
		return "a link-local address"
	}
	return notForTraffic(a)
}

// parseLegacyIPv4 reads dotted-quad IPv4 whose octets may carry leading zeros.
func parseLegacyIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if len(p) == 0 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return netip.Addr{}, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// parsePrefix parses a CIDR, masking host bits as the API server's own
// parsing does; a bare address is a single-host prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	addr, bits, hasBits := strings.Cut(s, "/")
	a, err := parseIPAllowUnspecified(addr)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
	}
	n := a.BitLen()
	if hasBits {
		n, err = strconv.Atoi(bits)
		if err != nil || n < 0 || n > a.BitLen() || strings.Trim(bits, "0123456789") != "" {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
		}
	}
	return netip.PrefixFrom(a, n).Masked(), nil
}

// parseIPAllowUnspecified is parseIP for prefixes, where 0.0.0.0/0 is fine.
func parseIPAllowUnspecified(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.IsUnspecified() {
		return a, nil
	}
	return parseIP(s)
}

func port16(p int32) (uint16, bool) {
	return uint16(p), p > 0 && p <= 65535
}
