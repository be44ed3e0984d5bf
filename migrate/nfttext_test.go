package migrate

import (
	"reflect"
	"strings"
	"testing"
)

func TestNFTSeconds(t *testing.T) {
	for in, want := range map[string]int{"3h": 10800, "2h46m40s": 10000, "10800s": 10800, "1d": 86400, "1m500ms": 60} {
		if got, err := nftSeconds(in); err != nil || got != want {
			t.Errorf("nftSeconds(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"3", "h", "3x", "1h2"} {
		if _, err := nftSeconds(bad); err == nil {
			t.Errorf("nftSeconds(%q): no error", bad)
		}
	}
}

func TestParseElement(t *testing.T) {
	for _, tc := range []struct {
		text  string
		isMap bool
		want  nftElement
	}{
		{`10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https`, true,
			nftElement{key: []string{"10.96.0.1", "tcp", "443"}, value: "goto service-2QRHZV4L-default/kubernetes/tcp/https"}},
		{`fd00:10:96::14 . tcp . 80 comment "default/dual:http" : goto reject-chain`, true,
			nftElement{key: []string{"fd00:10:96::14", "tcp", "80"}, comment: "default/dual:http", value: "goto reject-chain"}},
		{`10.244.0.5 . 10.244.0.5 . tcp . 8080`, false, nftElement{key: []string{"10.244.0.5", "10.244.0.5", "tcp", "8080"}}},
		{`10.0.0.2 timeout 3h expires 2h59m`, false, nftElement{key: []string{"10.0.0.2"}}},
	} {
		got, err := parseElement(tc.text, tc.isMap)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseElement(%q) = %+v, %v; want %+v", tc.text, got, err, tc.want)
		}
	}
	if _, err := parseElement("10.96.0.1 . tcp . 443", true); err == nil {
		t.Error("a map element without a value: no error")
	}
}

// A listing as nft prints one: other tables are skipped, elements spanning
// lines are joined, base chains' headers are not rules.
const smallListing = `table inet filter {
	chain input {
		type filter hook input priority filter; policy accept;
	}
}
table ip kube-proxy {
	comment "rules for kube-proxy"
	set affinity-ABC-default/sticky/tcp/http__10.244.0.10/8080 {
		type ipv4_addr
		flags dynamic,timeout
		timeout 3h
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https,
			     10.96.20.1 . tcp . 80 : goto service-ABCDEFGH-default/web/tcp/http }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain service-ABCDEFGH-default/web/tcp/http {
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.0.10 . 8080, 1 : 10.244.1.20 . 8080 }
	}
}
`

func TestParseNFTRuleset(t *testing.T) {
	rs, err := ParseNFTRuleset(strings.NewReader(smallListing))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Tables) != 1 || rs.Tables[0].ipv6 {
		t.Fatalf("tables %+v, want ip kube-proxy only", rs.Tables)
	}
	tb := rs.Tables[0]
	if n := len(tb.elements["service-ips"]); n != 2 {
		t.Errorf("service-ips: %d elements, want 2", n)
	}
	if got := tb.timeouts["affinity-ABC-default/sticky/tcp/http__10.244.0.10/8080"]; got != 10800 {
		t.Errorf("affinity timeout %d, want 10800", got)
	}
	if got := tb.chains["nat-prerouting"]; !reflect.DeepEqual(got, []string{"jump services"}) {
		t.Errorf("nat-prerouting rules %q", got)
	}
	f := upstreamFacts(tb)[Key{Service: "default/web:http", Proto: "tcp"}]
	want := modeFacts{catDestinations: {"10.96.20.1:80 -> cluster endpoints"},
		catEndpoints: {"cluster endpoints 10.244.0.10:8080 50.00%", "cluster endpoints 10.244.1.20:8080 50.00%"}}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("default/web:http facts %v, want %v", f, want)
	}
	for _, bad := range []string{"", "table ip kube-proxy {\n", "table ip filter {\n}\n", "chain x {\n}\n"} {
		if _, err := ParseNFTRuleset(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseNFTRuleset(%q): no error", bad)
		}
	}
}
