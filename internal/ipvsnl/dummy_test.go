package ipvsnl

import (
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/vmguest"
)

// The batched address messages, byte for byte: header, ifaddrmsg, then
// IFA_LOCAL and IFA_ADDRESS; create+exclusive for adds; an ack asked of
// the last message only; consecutive sequence numbers.
func TestAddrMessages(t *testing.T) {
	hdr := func(l uint32, typ, flags uint16, seq uint32) string {
		b := binary.NativeEndian.AppendUint32(nil, l)
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, flags)
		b = binary.NativeEndian.AppendUint32(b, seq)
		return hex.EncodeToString(append(b, 0, 0, 0, 0)) // pid 0: the kernel
	}
	le := func(v uint32) string { return hex.EncodeToString(binary.NativeEndian.AppendUint32(nil, v)) }
	attr := func(l, typ uint16) string {
		return hex.EncodeToString(binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(nil, l), typ))
	}
	req := uint16(unix.NLM_F_REQUEST)
	create := req | unix.NLM_F_CREATE | unix.NLM_F_EXCL
	for _, tc := range []struct {
		name  string
		typ   uint16
		addrs []netip.Addr
		want  string
		last  uint32
	}{
		{"add v4 and v6", unix.RTM_NEWADDR, []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")},
			hdr(16+8+8+8, unix.RTM_NEWADDR, create, 100) + "02" + "20" + "00" + "00" + le(7) +
				attr(8, unix.IFA_LOCAL) + "0a600001" + attr(8, unix.IFA_ADDRESS) + "0a600001" +
				hdr(16+8+20+20, unix.RTM_NEWADDR, create|unix.NLM_F_ACK, 101) + "0a" + "80" + "02" + "00" + le(7) +
				attr(20, unix.IFA_LOCAL) + "fd000000000000000000000000000001" + attr(20, unix.IFA_ADDRESS) + "fd000000000000000000000000000001",
			101},
		{"delete one", unix.RTM_DELADDR, []netip.Addr{netip.MustParseAddr("192.0.2.10")},
			hdr(16+8+8+8, unix.RTM_DELADDR, req|unix.NLM_F_ACK, 100) + "02" + "20" + "00" + "00" + le(7) +
				attr(8, unix.IFA_LOCAL) + "c000020a" + attr(8, unix.IFA_ADDRESS) + "c000020a",
			100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, last := addrMessages(tc.typ, 7, tc.addrs, 100)
			if hex.EncodeToString(got) != tc.want || last != tc.last {
				t.Errorf("messages\n%s (last seq %d)\nwant\n%s (last seq %d)", hex.EncodeToString(got), last, tc.want, tc.last)
			}
		})
	}
}

// Ten thousand addresses in one call (one per Service at 10k Services):
// they go in several writes, all land, and go again. Dummy links: the VM
// tier.
func TestKernelDummyManyAddrs(t *testing.T) {
	vmguest.RequireIPVS(t) // the guest has dummy links; this machine's kernel does not
	ns := testns.New(t, "knp-ipvs-")
	d, err := OpenDummy(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	addrs := make([]netip.Addr, 10000)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
	}
	if err := d.AddAddrs(addrs); err != nil {
		t.Fatalf("adding %d addresses: %v", len(addrs), err)
	}
	got, err := d.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(addrs) {
		t.Errorf("kube-ipvs0 holds %d addresses, want %d", len(got), len(addrs))
	}
	// One already there among new ones: its error alone, the rest applied.
	more := []netip.Addr{addrs[0], netip.MustParseAddr("10.97.0.1")}
	if err := d.AddAddrs(more); err == nil || !strings.Contains(err.Error(), addrs[0].String()) {
		t.Errorf("re-adding %s: %v, want its EEXIST", addrs[0], err)
	}
	if err := d.DelAddrs(append(addrs, more[1])); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Addrs(); err != nil || len(got) != 0 {
		t.Errorf("after deleting them all: %d addresses (%v)", len(got), err)
	}
}
