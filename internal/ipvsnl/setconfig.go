package ipvsnl

import (
	"time"

	"golang.org/x/sys/unix"
)

// IPVS_CMD_SET_CONFIG and its timeout attributes (linux/ip_vs.h), in
// seconds as u32.
const (
	cmdSetConfig         = 12
	attrCmdTimeoutTCP    = 4
	attrCmdTimeoutTCPFin = 5
	attrCmdTimeoutUDP    = 6
)

// Timeouts are IPVS's connection timeouts, as `ipvsadm --set tcp tcpfin
// udp`: --ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout. A
// zero one is left as the kernel has it; precision is a second.
type Timeouts struct {
	TCP, TCPFin, UDP time.Duration
}

// IsZero reports whether no timeout is to be set.
func (t Timeouts) IsZero() bool {
	return t.TCP < time.Second && t.TCPFin < time.Second && t.UDP < time.Second
}

// appendSetConfig encodes one SET_CONFIG with the timeouts that are set;
// the kernel keeps those not sent.
func appendSetConfig(b []byte, family uint16, seq uint32, t Timeouts) []byte {
	var a attrs
	for _, x := range []struct {
		typ uint16
		d   time.Duration
	}{{attrCmdTimeoutTCP, t.TCP}, {attrCmdTimeoutTCPFin, t.TCPFin}, {attrCmdTimeoutUDP, t.UDP}} {
		if s := x.d / time.Second; s > 0 {
			a.U32(x.typ, uint32(min(s, MaxTimeout)))
		}
	}
	return appendMessage(b, family, unix.NLM_F_ACK, seq, cmdSetConfig, ipvsGenlVersion, a)
}

// SetTimeouts sets IPVS's connection timeouts in one command; nothing is
// sent when t is zero.
func (c *Conn) SetTimeouts(t Timeouts) error {
	if t.IsZero() {
		return nil
	}
	_, err := c.roundTrip(appendSetConfig(nil, c.family, c.nextSeq(), t), func([]byte) error { return nil })
	return err
}
