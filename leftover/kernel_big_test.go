package leftover

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// bigKubeProxyRules writes an iptables-save style nat table as upstream
// kube-proxy's iptables mode leaves it with services Services of
// endpoints endpoints each: KUBE-SERVICES jumping to a KUBE-SVC-* chain per
// Service, which jumps to a KUBE-SEP-* chain per endpoint. It returns the
// number of kube-proxy chains in it.
func bigKubeProxyRules(path string, services, endpoints int) (int, error) {
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	for s := range services {
		fmt.Fprintf(&b, ":KUBE-SVC-%016X - [0:0]\n", s)
		for e := range endpoints {
			fmt.Fprintf(&b, ":KUBE-SEP-%016X - [0:0]\n", s*endpoints+e)
		}
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	b.WriteString("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n")
	for s := range services {
		ip := fmt.Sprintf("10.96.%d.%d", s/250, s%250+1)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns/svc-%d:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016X\n", ip, s, s)
		for e := range endpoints {
			sep := s*endpoints + e
			pod := fmt.Sprintf("10.244.%d.%d", sep/250, sep%250+1)
			fmt.Fprintf(&b, "-A KUBE-SVC-%016X -m comment --comment \"ns/svc-%d:http -> %s:8080\" -j KUBE-SEP-%016X\n", s, s, pod, sep)
			fmt.Fprintf(&b, "-A KUBE-SEP-%016X -s %s/32 -m comment --comment \"ns/svc-%d:http\" -j KUBE-MARK-MASQ\n", sep, pod, s)
			fmt.Fprintf(&b, "-A KUBE-SEP-%016X -p tcp -m comment --comment \"ns/svc-%d:http\" -m tcp -j DNAT --to-destination %s:8080\n", sep, s, pod)
		}
	}
	b.WriteString("COMMIT\n")
	return 3 + services*(1+endpoints), os.WriteFile(path, []byte(b.String()), 0o644)
}

// loadBigKubeProxy puts 8,000 kube-proxy chains (2,000 Services of 3
// endpoints) in iptables-nft's nat table of a new namespace.
func loadBigKubeProxy(t *testing.T) (ns string, chains int) {
	t.Helper()
	ns = testns.New(t, "knp-left-big-")
	rules := filepath.Join(t.TempDir(), "big.rules")
	chains, err := bigKubeProxyRules(rules, 2000, 3)
	if err != nil {
		t.Fatal(err)
	}
	inNS(t, ns, "iptables-nft-restore --noflush < "+rules)
	if n := countKubeChains(t, ns); n != chains {
		t.Fatalf("loaded %d kube-proxy chains, want %d", n, chains)
	}
	return ns, chains
}

// countKubeChains counts the KUBE-* chains of iptables-nft's ip nat table.
func countKubeChains(t *testing.T, ns string) int {
	t.Helper()
	out := testns.NFT(t, ns, "list", "chains", "ip")
	return strings.Count(out, "chain KUBE-")
}

// TestKernelCleanLarge removes 8,000 chains of kube-proxy's iptables mode
// in one transaction: every answer of the kernel must be read (or the
// result checked by reading the chains back), and the removal reported as
// the success it is.
func TestKernelCleanLarge(t *testing.T) {
	ns, chains := loadBigKubeProxy(t)
	start := time.Now()
	res, err := Clean(Config{NetNS: testns.Path(ns), Legacy: true})
	t.Logf("Clean of %d chains: %v", chains, time.Since(start))
	if err != nil {
		t.Fatalf("Clean: %v", err)
	}
	if n := countKubeChains(t, ns); n != 0 {
		t.Errorf("%d kube-proxy chains left", n)
	}
	if got := res.Counts["iptables_chain"]; got != chains {
		t.Errorf("counted %d chains removed, want %d", got, chains)
	}
	if got := res.Counts["iptables_jump"]; got != 3 {
		t.Errorf("counted %d jumps removed, want 3 (PREROUTING, OUTPUT, POSTROUTING)", got)
	}
}

// TestKernelCleanupCommandKeepsKubeProxy runs the built binary's --cleanup
// in a namespace where a kube-proxy has programmed 8,000 chains (rolling a
// node back from kube-nftproxy: docs/migration.md, step 6): --cleanup
// removes only what kube-nftproxy created, so every kube-proxy chain stays,
// and it exits 0 without an ERROR line.
func TestKernelCleanupCommandKeepsKubeProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ns, chains := loadBigKubeProxy(t)
	bin := filepath.Join(t.TempDir(), "kube-nftproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/kube-nftproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	start := time.Now()
	out, err := exec.Command("ip", "netns", "exec", ns, bin, "--cleanup").CombinedOutput()
	t.Logf("kube-nftproxy --cleanup beside %d kube-proxy chains: %v, %v\n%s", chains, time.Since(start), err, out)
	if err != nil {
		t.Errorf("kube-nftproxy --cleanup: %v", err)
	}
	if strings.Contains(string(out), "ERROR") {
		t.Errorf("kube-nftproxy --cleanup logged an ERROR")
	}
	if n := countKubeChains(t, ns); n != chains {
		t.Errorf("%d kube-proxy chains left of %d: --cleanup removed a running kube-proxy's rules", n, chains)
	}
}

// TestKernelCleanAnswersLost has the removal transaction's answers lost
// after it applied (a full receive queue: nftlib's TestKernelAnswersLost
// shows the kernel doing so): the state read back must make the removal
// the success it is.
func TestKernelCleanAnswersLost(t *testing.T) {
	ns := testns.New(t, "knp-left-")
	inNS(t, ns, "ipset create KUBE-CLUSTER-IP hash:ip,port\niptables-nft-restore --noflush < testdata/kube-proxy-v4.rules")
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	var removeErr error
	found, err := cleanNFTablesWith(k, func(k *nftlib.Kernel, f *nftFound) error {
		if removeErr = removeNFTables(k, f); removeErr == nil {
			removeErr = fmt.Errorf("removing kube-proxy's objects: %w", nftlib.ErrAnswersLost)
		}
		return removeErr
	})
	if !errors.Is(removeErr, nftlib.ErrAnswersLost) {
		t.Errorf("the transaction's result: %v, want its answers lost", removeErr)
	}
	if err != nil {
		t.Fatalf("cleanNFTables: %v", err)
	}
	if found == nil || len(found.iptables) != 3 {
		t.Errorf("found %+v, want ip nat, filter and mangle", found)
	}
	if n := countKubeChains(t, ns); n != 0 {
		t.Errorf("%d kube-proxy chains left", n)
	}
}
