#!/bin/sh
# A stand-in for kube-nftproxy, for the demo's own test: it programs the
# example Services of e2e/TOPOLOGY.md (default/web, default/dns-like) with
# plain nft rules, then waits for SIGTERM and removes them. It takes the
# proxy's flags and ignores them. It is not a reference for the real rules.
set -eu

cleanup() {
	nft delete table ip fake-proxy 2>/dev/null || true
	nft delete table ip6 fake-proxy 2>/dev/null || true
	echo "fake-proxy: rules removed"
	exit 0
}
trap cleanup TERM INT

nft -f - <<'EOF'
table ip fake-proxy {
	chain prerouting { type nat hook prerouting priority -100; policy accept; jump services; }
	chain output { type nat hook output priority -100; policy accept; jump services; }
	chain postrouting { type nat hook postrouting priority 100; policy accept; meta mark & 0x4000 == 0x4000 masquerade; }
	chain services {
		ip daddr 10.96.0.10 tcp dport 80 goto svc-web
		ip daddr 10.96.0.53 udp dport 53 goto svc-dns
		fib daddr type local tcp dport 30080 goto ext-web
		fib daddr type local udp dport 30053 goto ext-dns
	}
	chain ext-web { meta mark set mark | 0x4000; goto svc-web; }
	chain ext-dns { meta mark set mark | 0x4000; goto svc-dns; }
	chain svc-web {
		ip saddr != 10.244.0.0/16 meta mark set mark | 0x4000
		numgen random mod 2 vmap { 0 : goto web-a, 1 : goto web-b }
	}
	chain svc-dns {
		ip saddr != 10.244.0.0/16 meta mark set mark | 0x4000
		numgen random mod 2 vmap { 0 : goto dns-a, 1 : goto dns-b }
	}
	chain web-a { ip saddr 10.244.0.10 meta mark set mark | 0x4000; meta l4proto tcp dnat to 10.244.0.10:8080; }
	chain web-b { ip saddr 10.244.0.11 meta mark set mark | 0x4000; meta l4proto tcp dnat to 10.244.0.11:8080; }
	chain dns-a { ip saddr 10.244.0.10 meta mark set mark | 0x4000; meta l4proto udp dnat to 10.244.0.10:5353; }
	chain dns-b { ip saddr 10.244.0.11 meta mark set mark | 0x4000; meta l4proto udp dnat to 10.244.0.11:5353; }
}
table ip6 fake-proxy {
	chain prerouting { type nat hook prerouting priority -100; policy accept; jump services; }
	chain output { type nat hook output priority -100; policy accept; jump services; }
	chain postrouting { type nat hook postrouting priority 100; policy accept; meta mark & 0x4000 == 0x4000 masquerade; }
	chain services {
		ip6 daddr fd00:10:96::10 tcp dport 80 goto svc-web
	}
	chain svc-web {
		ip6 saddr != fd00:10:244::/48 meta mark set mark | 0x4000
		numgen random mod 2 vmap { 0 : goto web-a, 1 : goto web-b }
	}
	chain web-a { ip6 saddr fd00:10:244::10 meta mark set mark | 0x4000; meta l4proto tcp dnat to [fd00:10:244::10]:8080; }
	chain web-b { ip6 saddr fd00:10:244::11 meta mark set mark | 0x4000; meta l4proto tcp dnat to [fd00:10:244::11]:8080; }
}
EOF
echo "fake-proxy: rules programmed"
while :; do
	sleep 1 &
	wait $! || true
done
