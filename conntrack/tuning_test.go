package conntrack

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// tuningKernel is a fake /proc/sys and /sys/module in temporary directories.
type tuningKernel struct {
	proc, module string
}

const tuningHashsize = "module:" + sysctl.ConntrackHashsize

// A freshly booted kernel's values (on a 2-CPU node with little memory).
func tuningFresh() map[string]string {
	return map[string]string{
		keyMax:            "65536",
		tuningHashsize:    "16384",
		keyTCPEstablished: "432000",
		keyTCPCloseWait:   "60",
		keyTCPBeLiberal:   "0",
		keyUDPTimeout:     "30",
		keyUDPStream:      "120",
	}
}

// newTuningKernel writes the keys (tuningHashsize for the module
// parameter); those in readOnly get mode 0444.
func newTuningKernel(t *testing.T, keys map[string]string, readOnly []string) tuningKernel {
	t.Helper()
	k := tuningKernel{proc: t.TempDir(), module: t.TempDir()}
	for key, v := range keys {
		p := k.path(key)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if slices.Contains(readOnly, key) {
			mode = 0o444
		}
		if err := os.WriteFile(p, []byte(v+"\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

func (k tuningKernel) path(key string) string {
	if m, ok := strings.CutPrefix(key, "module:"); ok {
		return filepath.Join(k.module, m)
	}
	return filepath.Join(k.proc, key)
}

// read returns the keys as they are now (missing ones absent).
func (k tuningKernel) read(t *testing.T) map[string]string {
	t.Helper()
	got := map[string]string{}
	for key := range tuningFresh() {
		b, err := os.ReadFile(k.path(key))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got[key] = strings.TrimSpace(string(b))
	}
	return got
}

func (k tuningKernel) tuner(log *slog.Logger, cpus int) *Tuner {
	return &Tuner{
		Sysctl: sysctl.New(k.proc),
		Module: sysctl.New(k.module),
		NumCPU: func() int { return cpus },
		Log:    log,
	}
}

// warnings returns the key of each warning logged, in order.
func tuningWarnings(t *testing.T, logs string) []string {
	t.Helper()
	var keys []string
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, "level=WARN") {
			continue
		}
		_, after, ok := strings.Cut(l, " key=")
		if !ok {
			t.Errorf("warning without a key: %s", l)
			continue
		}
		keys = append(keys, strings.Fields(after)[0])
	}
	return keys
}

func TestTuningApply(t *testing.T) {
	with := func(base map[string]string, kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	fresh := tuningFresh()
	all := []string{keyMax, tuningHashsize, keyTCPEstablished, keyTCPCloseWait, keyTCPBeLiberal, keyUDPTimeout, keyUDPStream}
	tests := []struct {
		name     string
		cfg      TuningConfig
		cpus     int
		kernel   map[string]string
		readOnly []string
		want     map[string]string // the keys afterwards
		warned   []string          // keys warned about, in order
		wantErr  string
	}{{
		name: "DefaultsOnAFreshKernel", cfg: DefaultTuning(), cpus: 2, kernel: fresh,
		// max(32768*2, 131072) = 131072; hashsize 131072/4.
		want: with(fresh, keyMax, "131072", tuningHashsize, "32768", keyTCPEstablished, "86400", keyTCPCloseWait, "3600"),
	}, {
		name: "ScaledAboveMin", cfg: TuningConfig{MaxPerCore: 100000, Min: 131072}, cpus: 4, kernel: fresh,
		want: with(fresh, keyMax, "400000", tuningHashsize, "100000"),
	}, {
		name: "CappedAt1Mi", cfg: DefaultTuning(), cpus: 512, kernel: fresh,
		want: with(fresh, keyMax, "1048576", tuningHashsize, "262144", keyTCPEstablished, "86400", keyTCPCloseWait, "3600"),
	}, {
		name: "MaxNeverLowered", cfg: DefaultTuning(), cpus: 2,
		kernel: with(fresh, keyMax, "262144", tuningHashsize, "65536"),
		want:   with(fresh, keyMax, "262144", tuningHashsize, "65536", keyTCPEstablished, "86400", keyTCPCloseWait, "3600"),
	}, {
		// kube-proxy checks the hash size whether or not it raised the max.
		name: "HashsizeRaisedWithMaxHighEnough", cfg: DefaultTuning(), cpus: 2,
		kernel: with(fresh, keyMax, "262144", tuningHashsize, "1024"),
		want:   with(fresh, keyMax, "262144", tuningHashsize, "32768", keyTCPEstablished, "86400", keyTCPCloseWait, "3600"),
	}, {
		name: "MaxPerCoreZeroLeavesMaxAndIgnoresMin", cfg: TuningConfig{Min: 500000}, cpus: 2, kernel: fresh,
		want: fresh,
	}, {
		name: "ZeroLeavesEverything", cfg: TuningConfig{}, cpus: 2, kernel: fresh, readOnly: all,
		want: fresh,
	}, {
		name: "BeLiberalAndUDP", cpus: 2, kernel: fresh,
		cfg:  TuningConfig{TCPBeLiberal: true, UDPTimeout: 45 * time.Second, UDPStreamTimeout: 3 * time.Minute, TCPCloseWaitTimeout: 90*time.Second + 500*time.Millisecond},
		want: with(fresh, keyTCPBeLiberal, "1", keyUDPTimeout, "45", keyUDPStream, "180", keyTCPCloseWait, "90"),
	}, {
		// Equal values are not written: all keys read-only, no warning.
		name: "UnchangedValuesNotRewritten", cpus: 2, readOnly: all,
		cfg:    TuningConfig{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute},
		kernel: with(fresh, keyMax, "131072", tuningHashsize, "32768", keyTCPEstablished, "86400", keyTCPCloseWait, "3600", keyTCPBeLiberal, "1"),
		want:   with(fresh, keyMax, "131072", tuningHashsize, "32768", keyTCPEstablished, "86400", keyTCPCloseWait, "3600", keyTCPBeLiberal, "1"),
	}, {
		// A network namespace other than the initial one: nf_conntrack_max
		// is read-only, and the hash size global; the rest is applied.
		name: "ReadOnlyKeys", cfg: DefaultTuning(), cpus: 2, kernel: fresh,
		readOnly: []string{keyMax, tuningHashsize, keyTCPCloseWait},
		want:     with(fresh, keyTCPEstablished, "86400"),
		warned:   []string{keyMax, tuningHashsize, keyTCPCloseWait},
	}, {
		name: "MissingKeys", cfg: TuningConfig{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: time.Hour, UDPTimeout: time.Minute, UDPStreamTimeout: time.Hour}, cpus: 2,
		kernel: with(fresh, keyMax, "", tuningHashsize, "", keyUDPTimeout, ""),
		want:   with(fresh, keyMax, "", tuningHashsize, "", keyUDPTimeout, "", keyTCPEstablished, "3600", keyUDPStream, "3600"),
		warned: []string{keyMax, tuningHashsize, keyUDPTimeout},
	}, {
		// kube-proxy writes a value it cannot read.
		name: "UnreadableValueWritten", cfg: DefaultTuning(), cpus: 2,
		kernel: with(fresh, keyTCPEstablished, "garbage", keyMax, "lots"),
		want:   with(fresh, keyMax, "131072", tuningHashsize, "32768", keyTCPEstablished, "86400", keyTCPCloseWait, "3600"),
	}, {
		name: "NegativeRejected", cfg: TuningConfig{MaxPerCore: -1}, cpus: 2, kernel: fresh, want: fresh,
		wantErr: "--conntrack-max-per-core -1",
	}, {
		name: "SubSecondRejected", cfg: TuningConfig{UDPTimeout: time.Millisecond}, cpus: 2, kernel: fresh, want: fresh,
		wantErr: "--conntrack-udp-timeout 1ms",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newTuningKernel(t, tt.kernel, tt.readOnly)
			var logs bytes.Buffer
			tn := k.tuner(slog.New(slog.NewTextHandler(&logs, nil)), tt.cpus)
			skipped, err := tn.Apply(tt.cfg)
			t.Logf("log:\n%s", logs.String())
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Apply: %v, want an error mentioning %q", err, tt.wantErr)
			case tt.wantErr == "" && err != nil:
				t.Errorf("Apply: %v", err)
			}
			if got := k.read(t); !maps.Equal(got, tt.want) {
				t.Errorf("afterwards:\n got %v\nwant %v", got, tt.want)
			}
			var wantPaths []string
			for _, key := range tt.warned {
				wantPaths = append(wantPaths, k.path(key))
			}
			if got := tuningWarnings(t, logs.String()); !slices.Equal(got, wantPaths) {
				t.Errorf("warnings for %q, want one each for %q", got, wantPaths)
			}
			if len(skipped) != len(tt.warned) {
				t.Errorf("skipped %v, want %d errors", skipped, len(tt.warned))
			}
			for _, e := range skipped {
				if !errors.Is(e, sysctl.ErrReadOnly) && !errors.Is(e, fs.ErrNotExist) {
					t.Errorf("skipped %v: neither read-only nor missing", e)
				}
			}
		})
	}
}

// TestTuningWarningText: the warning names the key, the value wanted and
// the reason.
func TestTuningWarningText(t *testing.T) {
	k := newTuningKernel(t, tuningFresh(), []string{keyMax})
	var logs bytes.Buffer
	if _, err := k.tuner(slog.New(slog.NewTextHandler(&logs, nil)), 2).Apply(DefaultTuning()); err != nil {
		t.Fatal(err)
	}
	var warn string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") {
			warn = l
		}
	}
	for _, want := range []string{"key=" + k.path(keyMax), "want=131072", "read-only", "r--r--r--"} {
		if !strings.Contains(warn, want) {
			t.Errorf("warning %q lacks %q", warn, want)
		}
	}
}

// TestTuningFailure: an error that is neither "missing" nor "read-only"
// stops Apply, as it stops kube-proxy.
func TestTuningFailure(t *testing.T) {
	k := newTuningKernel(t, tuningFresh(), nil)
	p := k.path(keyTCPCloseWait)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := k.tuner(nil, 2).Apply(DefaultTuning())
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_tcp_timeout_close_wait") {
		t.Errorf("Apply with a directory for a key: %v, want an error naming it", err)
	}
}

func TestTuningWantedMax(t *testing.T) {
	for _, tt := range []struct {
		cfg  TuningConfig
		cpus int
		want int
	}{
		{TuningConfig{}, 8, 0},
		{TuningConfig{Min: 123456}, 8, 0}, // maxPerCore 0: leave it
		{TuningConfig{MaxPerCore: 67890, Min: 1}, 4, 67890 * 4},
		{TuningConfig{MaxPerCore: 1, Min: 123456}, 4, 123456},
		{DefaultTuning(), 1, 131072},
		{DefaultTuning(), 4, 131072},
		{DefaultTuning(), 8, 262144},
		{DefaultTuning(), 32, 1048576},
		{DefaultTuning(), 512, 1048576}, // capped
		{TuningConfig{MaxPerCore: 32768, Min: 2000000}, 512, 2000000},
	} {
		if got := tt.cfg.WantedMax(tt.cpus); got != tt.want {
			t.Errorf("%+v.WantedMax(%d) = %d, want %d", tt.cfg, tt.cpus, got, tt.want)
		}
	}
}

func TestTuningOnlineCPUs(t *testing.T) {
	for _, tt := range []struct {
		list string
		n    int
		ok   bool
	}{
		{"0", 1, true},
		{"0-1", 2, true},
		{"0-3,8-11", 8, true},
		{"0,2,4-5", 4, true},
		{"", 0, false},
		{"3-1", 0, false},
		{"x", 0, false},
	} {
		if n, ok := countCPUList(tt.list); n != tt.n || ok != tt.ok {
			t.Errorf("countCPUList(%q) = %d, %v; want %d, %v", tt.list, n, ok, tt.n, tt.ok)
		}
	}
	p := filepath.Join(t.TempDir(), "online")
	if err := os.WriteFile(p, []byte("0-5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := OnlineCPUs(p); n != 6 {
		t.Errorf("OnlineCPUs = %d, want 6", n)
	}
	if n := OnlineCPUs(filepath.Join(t.TempDir(), "none")); n < 1 {
		t.Errorf("OnlineCPUs of a missing file = %d, want runtime.NumCPU", n)
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		n, _ := countCPUList(strings.TrimSpace(string(b)))
		t.Logf("this node: %q = %d CPUs", strings.TrimSpace(string(b)), n)
		if got := OnlineCPUs("/sys/devices/system/cpu/online"); got != n {
			t.Errorf("OnlineCPUs = %d, want %d", got, n)
		}
	}
}
