package nftlib

import (
	"errors"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// A transaction larger than the socket's send buffer is refused before it
// is sent, with its size, the limit and the remedy.
func TestKernelSendBufferTooSmall(t *testing.T) {
	ns := testns.New(t, "knp-nftlib-")
	k := openTestKernel(t, ns)
	if err := k.setSendBuffer(4096); err != nil {
		t.Fatal(err)
	}
	x, _ := FullTx(stageTable(100), &KernelTable{}, false)
	tx := k.NewTx()
	var setID uint32
	x.Write(tx, &setID)
	err := k.CommitTx(tx)
	var big *txTooLargeError
	if !errors.Is(err, ErrTxTooLarge) || !errors.As(err, &big) || big.Size <= big.Limit {
		t.Fatalf("commit error = %v, want ErrTxTooLarge with the sizes", err)
	}
	for _, s := range []string{"CAP_NET_ADMIN", "net.core.wmem_max"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not mention %s: %v", s, err)
		}
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); got != "" {
		t.Errorf("something was programmed:\n%s", got)
	}
}
