package instance

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestLockIsExclusive(t *testing.T) {
	name := fmt.Sprintf("kube-nftproxy-test-%d", os.Getpid())
	first, err := acquire(name)
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	_, err = acquire(name)
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrRunning naming pid %d", err, os.Getpid())
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := acquire(name)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Release()
}
