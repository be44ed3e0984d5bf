package ipvsnl

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// unhex reads hex with spaces, newlines and "# comments".
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func littleEndian(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the layouts below are written out for a little-endian host")
	}
}

// Layouts derived by hand from linux/netlink.h, linux/genetlink.h and
// linux/ip_vs.h (family id 0x0024 stands for whatever the kernel gives).
func TestEncodeServiceMessage(t *testing.T) {
	littleEndian(t)
	s := Service{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: model.TCP, Port: 80},
		Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800, Netmask: 0xffffffff}
	got := appendOp(nil, 0x24, unix.NLM_F_ACK, 7, Op{Cmd: CmdNewService, Service: s})
	want := unhex(t, `
		5c000000 2400 0500 07000000 00000000  # nlmsghdr: len 92, type 0x24, REQUEST|ACK, seq 7, pid 0
		01 01 0000                            # genlmsghdr: IPVS_CMD_NEW_SERVICE, version 1
		4800 0180                             # IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED, len 72
		0600 0100 0200 0000                   #   AF: AF_INET (u16, padded)
		0600 0200 0600 0000                   #   PROTOCOL: IPPROTO_TCP
		0800 0300 0a60000a                    #   ADDR: 10.96.0.10
		0600 0400 0050 0000                   #   PORT: 80, big-endian
		0700 0600 727200 00                   #   SCHED_NAME: "rr\0", padded
		0c00 0700 01000000 ffffffff           #   FLAGS: {flags: persistent, mask: all}
		0800 0800 302a0000                    #   TIMEOUT: 10800
		0800 0900 ffffffff                    #   NETMASK
	`)
	if !bytes.Equal(got, want) {
		t.Errorf("got\n%x\nwant\n%x", got, want)
	}
}

func TestEncodeDestMessage(t *testing.T) {
	littleEndian(t)
	s := Service{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("fd00::a"), Protocol: model.UDP, Port: 53}}
	d := Dest{Addr: netip.MustParseAddrPort("[fd00:10:244::5]:5353"), Weight: 1, Fwd: FwdMasq}
	got := appendOp(nil, 0x24, 0, 8, Op{Cmd: CmdSetDest, Service: s, Dest: d})
	want := unhex(t, `
		8c000000 2400 0100 08000000 00000000  # nlmsghdr: len 140, REQUEST only (no ack asked), seq 8
		06 01 0000                            # IPVS_CMD_SET_DEST, version 1
		3000 0180                             # IPVS_CMD_ATTR_SERVICE, nested, len 48: the key only
		0600 0100 0a00 0000
		0600 0200 1100 0000
		1400 0300 fd00 0000 0000 0000 0000 0000 0000 000a  #   ADDR: fd00::a
		0600 0400 0035 0000                   #   PORT: 53
		4800 0280                             # IPVS_CMD_ATTR_DEST, nested, len 72
		1400 0100 fd00 0010 0244 0000 0000 0000 0000 0005  #   ADDR: fd00:10:244::5
		0600 0200 14e9 0000                   #   PORT: 5353
		0800 0300 00000000                    #   FWD_METHOD: masq
		0800 0400 01000000                    #   WEIGHT: 1
		0800 0500 00000000                    #   U_THRESH
		0800 0600 00000000                    #   L_THRESH
		0600 0b00 0a00 0000                   #   ADDR_FAMILY: AF_INET6
	`)
	if !bytes.Equal(got, want) {
		t.Errorf("got\n%x\nwant\n%x", got, want)
	}
}

func TestEncodeKeysOnly(t *testing.T) {
	s := Service{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.0.0.1"), Protocol: model.SCTP, Port: 1}, Scheduler: "rr"}
	d := Dest{Addr: netip.MustParseAddrPort("10.0.0.2:2"), Weight: 5}
	for _, tt := range []struct {
		op       Op
		size     int
		hasSched bool
	}{
		{Op{Cmd: CmdDelService, Service: s}, 20 + 4 + 32, false},
		{Op{Cmd: CmdSetService, Service: s}, 20 + 4 + 32 + 8 + 12 + 8 + 8, true},
		{Op{Cmd: CmdDelDest, Service: s, Dest: d}, 20 + 4 + 32 + 4 + 8 + 8 + 8, false},
	} {
		b := appendOp(nil, 0x24, 0, 1, tt.op)
		if len(b) != tt.size {
			t.Errorf("%s: %d bytes, want %d", tt.op.Cmd, len(b), tt.size)
		}
		if got := bytes.Contains(b, []byte("rr\x00")); got != tt.hasSched {
			t.Errorf("%s: scheduler present %v, want %v", tt.op.Cmd, got, tt.hasSched)
		}
	}
}

// The decoder reads what the kernel's dumps send: 16-byte addresses, the
// hashed flag set, counters; a round trip through our own attributes
// stands in for a dump message.
func TestDecodeRoundTrip(t *testing.T) {
	for _, s := range []Service{
		{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: model.TCP, Port: 80}, Scheduler: "mh", Flags: FlagSched2 | FlagPersistent, Timeout: 30, Netmask: 0xffffff00},
		{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("fd00::1"), Protocol: model.SCTP, Port: 9}, Scheduler: "rr", Netmask: 128},
	} {
		var a attrs
		a.Nest(attrCmdService, func(a *attrs) {
			a.U16(svcAttrAF, family(s.Addr))
			a.U16(svcAttrProtocol, protoNumber(s.Protocol))
			addr := s.Addr.As16()
			if s.Addr.Is4() {
				addr = [16]byte{}
				copy(addr[:], s.Addr.AsSlice())
			}
			a.Put(svcAttrAddr, addr[:]...)
			a.BE16(svcAttrPort, s.Port)
			a.Put(svcAttrSchedName, append([]byte(s.Scheduler), 0)...)
			a.Put(svcAttrFlags, binary.NativeEndian.AppendUint32(binary.NativeEndian.AppendUint32(nil, s.Flags|flagHashed), ^uint32(0))...)
			a.U32(svcAttrTimeout, s.Timeout)
			a.Put(svcAttrNetmask, netmaskBytes(s)...)
		})
		got, ok := parseService(append([]byte{byte(CmdNewService), 1, 0, 0}, a...))
		if !ok || got != s {
			t.Errorf("decoded %+v (ok %v), want %+v", got, ok, s)
		}
	}
	d := Dest{Addr: netip.MustParseAddrPort("10.244.0.1:8080"), Weight: 3, Fwd: FwdMasq, Active: 4, Inactive: 5}
	var a attrs
	a.Nest(attrCmdDest, func(a *attrs) {
		addr := [16]byte{10, 244, 0, 1}
		a.Put(destAttrAddr, addr[:]...)
		a.BE16(destAttrPort, 8080)
		a.U32(destAttrFwdMethod, 0)
		a.U32(destAttrWeight, 3)
		a.U32(destAttrActiveConns, 4)
		a.U32(destAttrInactConns, 5)
	})
	if got, ok := parseDest(append([]byte{byte(CmdNewDest), 1, 0, 0}, a...), unix.AF_INET); !ok || got != d {
		t.Errorf("decoded %+v (ok %v), want %+v", got, ok, d)
	}
	// A firewall-mark service is not ours.
	var fw attrs
	fw.Nest(attrCmdService, func(a *attrs) { a.U16(svcAttrAF, unix.AF_INET); a.U32(svcAttrFwmark, 1) })
	if _, ok := parseService(append([]byte{1, 1, 0, 0}, fw...)); ok {
		t.Error("firewall-mark service decoded as ours")
	}
}

func TestFamilyRequest(t *testing.T) {
	littleEndian(t)
	got := appendFamilyRequest(nil, 3, "IPVS")
	want := unhex(t, `
		20000000 1000 0500 03000000 00000000  # len 32, GENL_ID_CTRL, REQUEST|ACK, seq 3
		03 01 0000                            # CTRL_CMD_GETFAMILY, version 1
		0900 0200 49505653 00 000000          # CTRL_ATTR_FAMILY_NAME "IPVS\0", padded
	`)
	if !bytes.Equal(got, want) {
		t.Errorf("got\n%x\nwant\n%x", got, want)
	}
	var a attrs
	a.U16(ctrlAttrFamilyID, 0x24)
	if id, err := parseFamilyID(append([]byte{1, 1, 0, 0}, a...)); err != nil || id != 0x24 {
		t.Errorf("family id %#x, %v", id, err)
	}
}

func TestParseProcIPVS(t *testing.T) {
	const text = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr 
  -> 0AF4000A:1F90      Masq    1      2          3         
  -> 0AF4000B:1F90      Masq    0      0          7         
UDP  [fd00:0010:0096:0000:0000:0000:0000:0020]:0035 rr persistent 10800 00000080
  -> [fd00:0010:0244:0000:0000:0000:0000:0005]:0035      Masq    1      0          0         
FWM  00000001 rr 
  -> 0AF4000C:0050      Route   1      0          0         
SCTP  0A600505:0F1C mh 
`
	got, err := parseProcIPVS(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tcp := ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: model.TCP, Port: 80}
	udp := ServiceKey{Addr: netip.MustParseAddr("fd00:10:96::20"), Protocol: model.UDP, Port: 53}
	sctp := ServiceKey{Addr: netip.MustParseAddr("10.96.5.5"), Protocol: model.SCTP, Port: 3868}
	want := map[ServiceKey][]Dest{
		tcp: {{Addr: netip.MustParseAddrPort("10.244.0.10:8080"), Weight: 1, Active: 2, Inactive: 3},
			{Addr: netip.MustParseAddrPort("10.244.0.11:8080"), Weight: 0, Inactive: 7}},
		udp:  {{Addr: netip.MustParseAddrPort("[fd00:10:244::5]:53"), Weight: 1}},
		sctp: {},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d services, want %d: %v", len(got), len(want), got)
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok || len(g) != len(w) {
			t.Errorf("%s: got %v, want %v", k, g, w)
			continue
		}
		for i := range w {
			if g[i] != w[i] {
				t.Errorf("%s dest %d: got %+v, want %+v", k, i, g[i], w[i])
			}
		}
	}
	if _, err := parseProcIPVS(strings.NewReader("a\nb\nc\nTCP  zz:0050 rr\n")); err == nil {
		t.Error("a bad address parsed")
	}
}
