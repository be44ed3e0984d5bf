package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// kube-proxy's feature gate AllowServiceExternalIPs (GA, on by default;
// KEP-5707 turns it off later): off, no Service's spec.externalIPs are
// programmed, in any mode, and the proxy logs one line per Service whose
// external IPs it leaves out (upstream logs nothing).

const (
	gateExternalIPsOn  = "--feature-gates=AllowServiceExternalIPs=true"
	gateExternalIPsOff = "--feature-gates=AllowServiceExternalIPs=false"
	// msgExternalIPsIgnored is the proxy's line for such a Service.
	msgExternalIPsIgnored = "Ignoring the Service's externalIPs: feature gate AllowServiceExternalIPs is disabled"
)

// TestFeatureGateAllowServiceExternalIPs: on the edge Services, with the
// gate on, ext-ip's external IPs are in the ruleset and answer TCP from the
// client; with it off (nftables and iptables mode), neither ext-ip's nor
// none's external IPs are anywhere in the ruleset, TCP to ext-ip's meets the
// node's own unreachable route (not DNATed, not rejected: untouched by the
// proxy), the Service's cluster IP still answers, and each of the two
// Services gets one log line naming its addresses.
func TestFeatureGateAllowServiceExternalIPs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		allowed bool
	}{
		{"nftables, gate on", []string{gateExternalIPsOn}, true},
		{"nftables, gate off", []string{gateExternalIPsOff}, false},
		{"iptables, gate off", []string{"--proxy-mode=iptables", gateExternalIPsOff}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEdgeEnv(t, tc.args...)
			routeUnreachable(t, e, edgeFamilies[0].extIP, edgeFamilies[1].extIP)
			_, text := edgeRuleset(t, e)
			for _, f := range edgeFamilies {
				for _, ip := range []netip.Addr{f.extIP, f.none.extIP} {
					if in := rulesetMentions(text, ip); in != tc.allowed {
						t.Errorf("%s: the ruleset mentions external IP %v: %t, want %t", f.name, ip, in, tc.allowed)
					}
				}
				ext := edgeAddr(f.extIP, edgeHTTPPort)
				if tc.allowed {
					edgeExpectMasq(t, e, sandbox.Client, "tcp", ext, f.client)
				} else {
					edgeExpectICMPError(t, e, "unreachable", sandbox.Client, "tcp", ext)
				}
				edgeExpectMasq(t, e, sandbox.Client, "tcp", edgeAddr(f.clusterIP["ext-ip"], edgeHTTPPort), f.client)
			}
			want := map[string][]string{}
			if !tc.allowed {
				v4, v6 := edgeFamilies[0], edgeFamilies[1]
				want["edge/ext-ip"] = []string{externalIPsField(v4.extIP, v6.extIP)}
				want["edge/none"] = []string{externalIPsField(v4.none.extIP, v6.none.extIP)}
			}
			checkIgnoredLines(t, e.proxy.log.lines(), want)
		})
	}
}

// TestFeatureGateExternalIPsLogOncePerChange: with the gate off, a change
// of ext-ip that the proxy does not use (a label), made together with a
// change that makes it sync, logs nothing more; a change of its external
// IPs logs the line again, with the new addresses, which stay unprogrammed.
func TestFeatureGateExternalIPsLogOncePerChange(t *testing.T) {
	t.Parallel()
	e := newEdgeEnv(t, gateExternalIPsOff)
	v4, v6 := edgeFamilies[0], edgeFamilies[1]
	first := externalIPsField(v4.extIP, v6.extIP)
	none := externalIPsField(v4.none.extIP, v6.none.extIP)
	checkIgnoredLines(t, e.proxy.log.lines(), map[string][]string{"edge/ext-ip": {first}, "edge/none": {none}})

	const extHead = "  name: ext-ip\n  namespace: " + edgeNamespace + "\n"
	labelled := strings.Replace(edgeState(), extHead, extHead+"  labels: {touched: \"yes\"}\n", 1)
	probe := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: probe, namespace: %s}\nspec:\n  clusterIP: 10.96.3.90\n  ports: [{name: http, port: 80}]\n", edgeNamespace)
	before := e.proxy.syncs()
	writeAtomic(t, e.state, edgeStateFile, documents(labelled, probe))
	e.proxy.waitLog(t, 10*time.Second, "the sync adding edge/probe", func([]string) bool { return e.proxy.syncs() > before })
	checkIgnoredLines(t, e.proxy.log.lines(), map[string][]string{"edge/ext-ip": {first}, "edge/none": {none}})

	added := netip.MustParseAddr("203.0.113.11")
	oldList := fmt.Sprintf("  externalIPs: [%s, %q]\n", v4.extIP, v6.extIP)
	newList := fmt.Sprintf("  externalIPs: [%s, %q, %s]\n", v4.extIP, v6.extIP, added)
	if !strings.Contains(labelled, oldList) {
		t.Fatalf("edge.yaml has no line %q", oldList)
	}
	writeAtomic(t, e.state, edgeStateFile, documents(strings.Replace(labelled, oldList, newList, 1), probe))
	second := externalIPsField(v4.extIP, v6.extIP, added)
	e.proxy.waitLog(t, 10*time.Second, "the line for ext-ip's new external IPs", func(lines []string) bool {
		return len(ignoredLines(lines, "edge/ext-ip")) == 2
	})
	checkIgnoredLines(t, e.proxy.log.lines(), map[string][]string{"edge/ext-ip": {first, second}, "edge/none": {none}})
	if _, text := edgeRuleset(t, e); rulesetMentions(text, added) {
		t.Errorf("the ruleset mentions the added external IP %v", added)
	}
}

// routeUnreachable gives the node unreachable routes to addrs: traffic
// to them that no rule DNATs gets an ICMP error at once.
func routeUnreachable(t *testing.T, e *env, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		if _, err := e.sb.Exec(t.Context(), sandbox.Node, "ip", "route", "add", "unreachable", netip.PrefixFrom(a, a.BitLen()).String()); err != nil {
			t.Fatal(err)
		}
	}
}

// rulesetMentions reports whether nft's listing names the address as a
// word of its own.
func rulesetMentions(text string, a netip.Addr) bool {
	return strings.Contains(strings.NewReplacer("\t", " ", "\n", " ").Replace(" "+text+" "), " "+a.String()+" ")
}

// externalIPsField is the externalIPs key and value of the proxy's line in
// klog's text format.
func externalIPsField(ips ...netip.Addr) string {
	quoted := make([]string, len(ips))
	for i, ip := range ips {
		quoted[i] = fmt.Sprintf("%q", ip.String())
	}
	return "externalIPs=[" + strings.Join(quoted, ",") + "]"
}

// ignoredLines are the proxy's lines for the Service ns/name whose
// external IPs it ignores.
func ignoredLines(lines []string, service string) []string {
	var out []string
	for _, l := range lines {
		if isLogMsg(l, msgExternalIPsIgnored) && strings.Contains(l, fmt.Sprintf(" service=%q ", service)) {
			out = append(out, l)
		}
	}
	return out
}

// checkIgnoredLines wants, for each Service, one info line per entry of
// want (in order) containing that text, and no such line for any other
// Service.
func checkIgnoredLines(t *testing.T, lines []string, want map[string][]string) {
	t.Helper()
	total := 0
	for _, l := range lines {
		if isLogMsg(l, msgExternalIPsIgnored) {
			total++
		}
	}
	count := 0
	for svc, texts := range want {
		got := ignoredLines(lines, svc)
		count += len(got)
		if len(got) != len(texts) {
			t.Errorf("%s: %d lines %q, want %d:\n%s", svc, len(got), msgExternalIPsIgnored, len(texts), strings.Join(got, "\n"))
			continue
		}
		for i, l := range got {
			if !isInfoLine(l) || !strings.Contains(l, texts[i]) {
				t.Errorf("%s: line %d is %q; want an info line with %s", svc, i+1, l, texts[i])
			}
		}
	}
	if total != count {
		t.Errorf("%d lines %q, want %d", total, msgExternalIPsIgnored, count)
	}
}
