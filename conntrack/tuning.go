package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// TuningConfig is kube-proxy's conntrack tuning: its --conntrack-* flags,
// or the conntrack section of a KubeProxyConfiguration. A zero value leaves
// the kernel's setting alone.
type TuningConfig struct {
	// MaxPerCore scales nf_conntrack_max with the node's CPUs (0: leave
	// nf_conntrack_max and the hash size alone, and ignore Min).
	MaxPerCore int32
	// Min is the least nf_conntrack_max when MaxPerCore is set.
	Min int32
	// TCPEstablishedTimeout is nf_conntrack_tcp_timeout_established.
	TCPEstablishedTimeout time.Duration
	// TCPCloseWaitTimeout is nf_conntrack_tcp_timeout_close_wait.
	TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1 (false leaves it).
	TCPBeLiberal bool
	// UDPTimeout is nf_conntrack_udp_timeout (unreplied UDP flows).
	UDPTimeout time.Duration
	// UDPStreamTimeout is nf_conntrack_udp_timeout_stream (assured UDP flows).
	UDPStreamTimeout time.Duration
}

// DefaultTuning is kube-proxy's defaults: 32768 per core, at least 131072,
// established TCP flows kept 24h idle, CLOSE_WAIT 1h, the UDP timeouts and
// be_liberal left as they are.
func DefaultTuning() TuningConfig {
	return TuningConfig{
		MaxPerCore:            32 * 1024,
		Min:                   128 * 1024,
		TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout:   time.Hour,
	}
}

// Validate rejects what kube-proxy's validation rejects (negative values),
// and timeouts below one second, which the kernel would take as 0.
func (c TuningConfig) Validate() error {
	if c.MaxPerCore < 0 {
		return fmt.Errorf("--conntrack-max-per-core %d: must be 0 or more", c.MaxPerCore)
	}
	if c.Min < 0 {
		return fmt.Errorf("--conntrack-min %d: must be 0 or more", c.Min)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--conntrack-tcp-timeout-established", c.TCPEstablishedTimeout},
		{"--conntrack-tcp-timeout-close-wait", c.TCPCloseWaitTimeout},
		{"--conntrack-udp-timeout", c.UDPTimeout},
		{"--conntrack-udp-timeout-stream", c.UDPStreamTimeout},
	} {
		if d.v < 0 || (d.v > 0 && d.v < time.Second) {
			return fmt.Errorf("%s %v: must be 0 (leave as is) or at least 1s", d.flag, d.v)
		}
	}
	return nil
}

// TuningMaxLimit caps the per-core scaled nf_conntrack_max, as kube-proxy
// does since 1.36, so that nodes with many cores do not allocate a huge
// table.
const TuningMaxLimit = 1 << 20

// The keys under /proc/sys.
const (
	keyMax            = "net/netfilter/nf_conntrack_max"
	keyTCPEstablished = "net/netfilter/nf_conntrack_tcp_timeout_established"
	keyTCPCloseWait   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	keyTCPBeLiberal   = "net/netfilter/nf_conntrack_tcp_be_liberal"
	keyUDPTimeout     = "net/netfilter/nf_conntrack_udp_timeout"
	keyUDPStream      = "net/netfilter/nf_conntrack_udp_timeout_stream"
)

// WantedMax is the nf_conntrack_max the configuration asks for on a node
// with numCPU CPUs, 0 for "leave it": MaxPerCore × numCPU, at most
// TuningMaxLimit, and at least Min.
func (c TuningConfig) WantedMax(numCPU int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	return max(min(int(c.MaxPerCore)*numCPU, TuningMaxLimit), int(c.Min))
}

// Tuner applies a TuningConfig to the kernel.
type Tuner struct {
	// Sysctl is /proc/sys (tests: a temporary directory).
	Sysctl *sysctl.Sysctl
	// Module is /sys/module, where nf_conntrack's hashsize is.
	Module *sysctl.Sysctl
	// NumCPU counts the node's CPUs.
	NumCPU func() int
	Log    *slog.Logger
}

// NewTuner returns a Tuner for this node's kernel.
func NewTuner(log *slog.Logger) *Tuner {
	return &Tuner{
		Sysctl: sysctl.New(sysctl.DefaultRoot),
		Module: sysctl.New(sysctl.ModuleRoot),
		NumCPU: func() int { return OnlineCPUs("/sys/devices/system/cpu/online") },
		Log:    log,
	}
}

// Apply sets the conntrack sysctls as kube-proxy does at start:
//
//   - with MaxPerCore > 0, nf_conntrack_max is raised to WantedMax when it
//     is lower (never lowered), and nf_conntrack's hashsize to a quarter of
//     that when it is lower;
//   - each timeout > 0 (in whole seconds) and be_liberal (when true, as 1)
//     is written when the kernel's value differs.
//
// A key that is missing in this kernel or cannot be written here (a
// read-only /proc/sys or /sys, nf_conntrack_max or the hashsize in a
// network namespace other than the initial one) is logged once as a
// warning naming the key and the reason, returned in skipped, and the
// others are still applied. Any other failure stops Apply with an error,
// as kube-proxy stops.
func (t *Tuner) Apply(c TuningConfig) (skipped []error, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	run := &tuningRun{t: t, log: t.Log}
	if run.log == nil {
		run.log = slog.New(slog.DiscardHandler)
	}
	if want := c.WantedMax(t.numCPU()); want > 0 {
		if err := run.raiseMax(want); err != nil {
			return run.skipped, err
		}
	}
	for _, s := range c.settings() {
		if err := run.set(s); err != nil {
			return run.skipped, err
		}
	}
	return run.skipped, nil
}

// tuningRun is one Apply: where it logs, and the errors it tolerated.
type tuningRun struct {
	t       *Tuner
	log     *slog.Logger
	skipped []error
}

// skip logs and collects a tolerated error; any other is returned.
func (r *tuningRun) skip(err error, want int) error {
	if !tolerated(err) {
		return fmt.Errorf("conntrack tuning: %w", err)
	}
	var se *sysctl.Error
	key, reason := "", err.Error()
	if errors.As(err, &se) {
		key, reason = se.Path, se.Reason
	}
	r.log.Warn("conntrack tuning: leaving a kernel setting as it is", "key", key, "want", want, "reason", reason)
	r.skipped = append(r.skipped, err)
	return nil
}

// raiseMax raises nf_conntrack_max to want and the hash size to a quarter
// of it, as kube-proxy. Only ever raised: a higher value set by the
// administrator stays, and a node where we may not write it is left alone
// when it is already large enough. A value that cannot be read is written.
func (r *tuningRun) raiseMax(want int) error {
	cur, err := r.t.Sysctl.GetInt(keyMax)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := r.skip(err, want); err != nil {
			return err
		}
	case err != nil || cur < want:
		if err := r.write(r.t.Sysctl, keyMax, want, cur); err != nil {
			if err := r.skip(err, want); err != nil {
				return err
			}
		}
	}
	wantHash := want / 4
	hs, err := r.t.Module.GetInt(sysctl.ConntrackHashsize)
	if err == nil && hs < wantHash {
		err = r.write(r.t.Module, sysctl.ConntrackHashsize, wantHash, hs)
	}
	if err != nil {
		return r.skip(err, wantHash)
	}
	return nil
}

// setting is one sysctl under /proc/sys and the value it should have.
type setting struct {
	key  string
	want int
}

// settings are the timeouts (in whole seconds) and be_liberal that c sets.
func (c TuningConfig) settings() []setting {
	var out []setting
	seconds := func(key string, d time.Duration) {
		if d > 0 {
			out = append(out, setting{key, int(d / time.Second)})
		}
	}
	seconds(keyTCPEstablished, c.TCPEstablishedTimeout)
	seconds(keyTCPCloseWait, c.TCPCloseWaitTimeout)
	if c.TCPBeLiberal {
		out = append(out, setting{keyTCPBeLiberal, 1})
	}
	seconds(keyUDPTimeout, c.UDPTimeout)
	seconds(keyUDPStream, c.UDPStreamTimeout)
	return out
}

// set writes s when it differs; a value that cannot be read is written, a
// missing key warned about once.
func (r *tuningRun) set(s setting) error {
	cur, err := r.t.Sysctl.GetInt(s.key)
	if err == nil && cur == s.want {
		r.log.Debug("conntrack tuning: already set", "key", r.t.Sysctl.Path(s.key), "value", cur)
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		err = r.write(r.t.Sysctl, s.key, s.want, cur)
	}
	if err != nil {
		return r.skip(err, s.want)
	}
	return nil
}

func (r *tuningRun) write(s *sysctl.Sysctl, key string, v, was int) error {
	if err := s.SetInt(key, v); err != nil {
		return err
	}
	r.log.Info("conntrack tuning: set", "key", s.Path(key), "value", v, "was", was)
	return nil
}

func (t *Tuner) numCPU() int {
	if t.NumCPU != nil {
		if n := t.NumCPU(); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// tolerated reports the errors after which the proxy runs on: the key is
// missing, or may not be written (or read) here.
func tolerated(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, sysctl.ErrReadOnly) || errors.Is(err, fs.ErrPermission)
}

// OnlineCPUs counts the CPUs in a kernel CPU list file such as
// /sys/devices/system/cpu/online ("0-3,8-11"): all of the node's CPUs, not
// only those this process may run on, as kube-proxy counts them (the limit
// is for the whole node). It falls back to runtime.NumCPU.
func OnlineCPUs(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return runtime.NumCPU()
	}
	n, ok := countCPUList(strings.TrimSpace(string(b)))
	if !ok || n < 1 {
		return runtime.NumCPU()
	}
	return n
}

// countCPUList counts the CPUs of a list such as "0-3,8,10-11".
func countCPUList(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, false
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, false
			}
		}
		n += b - a + 1
	}
	return n, true
}
