package main

import (
	"errors"
	"testing"
	"testing/fstest"
)

// Mount lines of /proc/self/mountinfo as the hosts and containers below
// have them.
const (
	mountV1Memory  = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	mountV1CPU     = "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	mountUnified   = "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	mountV2        = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	mountContainer = "1280 1277 0:31 /kubepods/burstable/pod1/c1 /sys/fs/cgroup/memory ro,nosuid master:15 - cgroup cgroup rw,memory\n"
)

// TestCgroupMemoryLimit resolves the memory limit from sample
// /proc/self/cgroup and mountinfo contents and the limit files they lead
// to.
func TestCgroupMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name      string
		cgroup    string
		mountinfo string
		files     map[string]string // limit files, by path
		want      int64
		wantFile  string
		wantErr   error // errNoMemoryCgroup, or any error: errAny
	}{
		{
			name:      "v1 hybrid host, a child cgroup",
			cgroup:    "4:memory:/process_api/x\n1:cpu:/\n0::/\n",
			mountinfo: mountV1CPU + mountV1Memory + mountUnified,
			files: map[string]string{
				"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "104857600\n",
				"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":   "9223372036854771712\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
			},
			want: 100 * mib, wantFile: "/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes",
		},
		{
			name:      "v1 container: its cgroup bind-mounted as the hierarchy",
			cgroup:    "7:memory:/kubepods/burstable/pod1/c1\n",
			mountinfo: mountContainer,
			files: map[string]string{
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456",
			},
			want: 256 * mib, wantFile: "/sys/fs/cgroup/memory/memory.limit_in_bytes",
		},
		{
			name:      "v1, controllers mounted together",
			cgroup:    "3:cpu,memory:/a\n",
			mountinfo: "25 20 0:22 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n",
			files:     map[string]string{"sys/fs/cgroup/cpu,memory/a/memory.limit_in_bytes": "1048576"},
			want:      mib, wantFile: "/sys/fs/cgroup/cpu,memory/a/memory.limit_in_bytes",
		},
		{
			name:      "v2 container with a cgroup namespace",
			cgroup:    "0::/\n",
			mountinfo: mountV2,
			files:     map[string]string{"sys/fs/cgroup/memory.max": "268435456\n"},
			want:      256 * mib, wantFile: "/sys/fs/cgroup/memory.max",
		},
		{
			name:      "v2 host: the pod's limit below the container's",
			cgroup:    "0::/kubepods.slice/pod1.slice/c1.scope\n",
			mountinfo: mountV2,
			files: map[string]string{
				"sys/fs/cgroup/kubepods.slice/pod1.slice/c1.scope/memory.max": "max\n",
				"sys/fs/cgroup/kubepods.slice/pod1.slice/memory.max":          "209715200\n",
				"sys/fs/cgroup/kubepods.slice/memory.max":                     "1073741824\n",
			},
			want: 200 * mib, wantFile: "/sys/fs/cgroup/kubepods.slice/pod1.slice/memory.max",
		},
		{
			name:      "v2 max",
			cgroup:    "0::/a\n",
			mountinfo: mountV2,
			files:     map[string]string{"sys/fs/cgroup/a/memory.max": "max\n"},
		},
		{
			name:      "v1 unlimited",
			cgroup:    "4:memory:/\n",
			mountinfo: mountV1Memory,
			files:     map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"},
		},
		{
			name:      "v2 without the memory controller enabled",
			cgroup:    "0::/a\n",
			mountinfo: mountV2,
		},
		{
			name:      "hybrid: the limit is on v1, not the unified mount",
			cgroup:    "4:memory:/a\n0::/a\n",
			mountinfo: mountUnified + mountV1Memory,
			files: map[string]string{
				"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "1048576",
				"sys/fs/cgroup/unified/a/memory.max":           "2097152",
			},
			want: mib, wantFile: "/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
		},
		{
			name:      "no memory controller",
			cgroup:    "1:cpu:/\n2:pids:/\n",
			mountinfo: mountV1CPU,
			wantErr:   errNoMemoryCgroup,
		},
		{
			name:      "the mount's root does not hold the cgroup",
			cgroup:    "4:memory:/kubepods/burstable/pod1/c10\n",
			mountinfo: mountContainer,
			wantErr:   errNoMemoryCgroup,
		},
		{
			name:      "outside the cgroup namespace's root",
			cgroup:    "0::/../other\n",
			mountinfo: mountV2,
			wantErr:   errNoMemoryCgroup,
		},
		{
			name:      "an unreadable value",
			cgroup:    "0::/\n",
			mountinfo: mountV2,
			files:     map[string]string{"sys/fs/cgroup/memory.max": "lots\n"},
			wantErr:   errAny,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{
				"proc/self/cgroup":    {Data: []byte(tc.cgroup)},
				"proc/self/mountinfo": {Data: []byte(tc.mountinfo)},
			}
			for p, v := range tc.files {
				fsys[p] = &fstest.MapFile{Data: []byte(v)}
			}
			got, file, err := cgroupMemoryLimit(fsys)
			switch {
			case tc.wantErr == errAny && err != nil:
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil && err != nil:
				t.Fatalf("err = %v", err)
			}
			if got != tc.want || file != tc.wantFile {
				t.Errorf("limit %d from %q, want %d from %q", got, file, tc.want, tc.wantFile)
			}
		})
	}
}

// errAny stands for any error in a test's want.
var errAny = errors.New("any error")
