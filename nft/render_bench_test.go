package nft

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// BenchmarkNftToolLoad loads the render of the same states with the nft
// tool, for comparison with BenchmarkKernelFullSync: its system time is the
// kernel's own cost of the same objects sent the way nft sends them.
func BenchmarkNftToolLoad(b *testing.B) {
	if _, err := exec.LookPath("nft"); err != nil {
		b.Skip("needs the nft binary (package nftables) for the comparison")
	}
	for _, n := range []int{1000, 5000} {
		file := filepath.Join(b.TempDir(), "ruleset.nft")
		if err := os.WriteFile(file, []byte(Build(scaleState(n, 10), demoConfig()).String()), 0o644); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ns := testns.New(b, "knp-nft-")
				b.StartTimer()
				cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", file)
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("nft -f: %v: %s", err, out)
				}
				b.ReportMetric(cmd.ProcessState.SystemTime().Seconds()*1000, "sys-ms")
				b.ReportMetric(cmd.ProcessState.UserTime().Seconds()*1000, "user-ms")
			}
		})
	}
}
