package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Nodes in user-mode Linux guests (KNP_CLUSTER_NODE_KERNEL, hack/vm/cluster.sh).
//
// A kernel without IPVS cannot host an IPVS-mode proxy, so with
// Layout.NodeKernel set each node is a UML guest running that kernel (one
// with IPVS) as processes of this machine, while the control plane and
// e2e.test stay here in the node network at native speed. A guest's root is
// this machine's, read-only over hostfs with a tmpfs above it
// (hack/vm/uml-init); its eth0 is a tap device on the node bridge, so the
// node's addresses and everything around them are those of a namespace
// node. In the guest, `cluster guest-node <name>` (RunGuestNode) names the
// guest's own network namespace after the node, so that the code that
// starts a namespace node's containerd and kubelet starts them there
// unchanged.

const (
	nodeKernelEnv    = "KNP_CLUSTER_NODE_KERNEL"
	nodeMemEnv       = "KNP_CLUSTER_NODE_MEM"
	guestImagesEnv   = "KNP_CLUSTER_GUEST_IMAGES"
	defaultNodeMemMB = 5120
	guestStarted     = "started" // written in the share once kubelet runs
)

// VMNodes reports whether the nodes are UML guests.
func (l Layout) VMNodes() bool { return l.NodeKernel != "" }

// vmShare is the host directory a node's guest mounts writable: its
// script, results.log and the started marker.
func (l Layout) vmShare(n Node) string { return filepath.Join(l.Dir, "vm", n.Name) }

func tapName(n Node) string { return "tap-" + n.Name }

// vmNetworkSteps are networkSteps' per-node part for guests: a tap device
// on the bridge in place of a namespace and its veth.
func (l Layout) vmNetworkSteps(n Node) [][]string {
	return [][]string{
		{"ip", "-n", l.NodeNet, "tuntap", "add", "dev", tapName(n), "mode", "tap"},
		{"ip", "-n", l.NodeNet, "link", "set", tapName(n), "master", BridgeName, "up"},
	}
}

// nodeMemMB is each guest's memory: KNP_CLUSTER_NODE_MEM (MiB) or 5 GiB,
// enough for the image store (in the guest's tmpfs) and the pods.
func nodeMemMB() int {
	if v, err := strconv.Atoi(os.Getenv(nodeMemEnv)); err == nil && v >= 1024 {
		return v
	}
	return defaultNodeMemMB
}

// UMLArgs is the command line of node n's guest. initPath is uml-init.
func (l Layout) UMLArgs(n Node, initPath string) []string {
	return []string{l.NodeKernel,
		fmt.Sprintf("mem=%dM", nodeMemMB()),
		"root=/dev/root", "rootfstype=hostfs", "rootflags=/", "ro",
		"init=" + initPath, "knp.share=" + l.vmShare(n),
		"eth0=tuntap," + tapName(n),
		"con=null", "con0=null,fd:1"}
}

// guestScript is the share's guest.sh: uml-init runs it with results.log
// as $1, and it becomes `cluster guest-node` with the cluster's settings.
func (l Layout) guestScript(n Node, bin string) string {
	env := [][2]string{
		{"KNP_CLUSTER_DIR", l.Dir}, {"KNP_CACHE", l.Cache}, {"KNP_CLUSTER_IMAGES", l.Images},
		{"KNP_CLUSTER_FAMILY", l.Family}, {"KNP_CLUSTER_NODES", strconv.Itoa(len(l.Nodes))},
		{"KNP_CLUSTER_PROXY", l.Proxy}, {guestImagesEnv, l.GuestImages},
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\nexec >\"$1\" 2>&1\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n")
	for _, kv := range env {
		fmt.Fprintf(&b, "export %s='%s'\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "exec %s guest-node %s\n", bin, n.Name)
	return b.String()
}

// startVMNodes boots a guest per node and waits until each has imported
// the images and started kubelet. repo is the checkout (for uml-init).
// Flannel's CNI configuration is written first: the guest copies the
// node's directory at boot and sees no later write.
func (l Layout) startVMNodes(ctx context.Context, repo string, refs imageRefs, logf func(string, ...any)) error {
	if !l.useFlannel(refs) {
		return errors.New("nodes in VMs need flannel (its image and CNI plugin in the cache; KNP_CLUSTER_CNI=bridge is not offered)")
	}
	// Built, not copied from os.Executable: that may be a test binary, or
	// go run's, deleted when it ends.
	bin := filepath.Join(l.Dir, "vm", "knp-cluster")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./e2e/cluster/cmd")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("the cluster command for the guests: %w: %s", err, out)
	}
	initPath := filepath.Join(repo, "hack", "vm", "uml-init")
	errs := make(chan error, len(l.Nodes))
	for _, n := range l.Nodes {
		files := []struct {
			path, text string
			mode       os.FileMode
		}{
			{l.nodeFile(n, "cni-net.d/10-flannel.conflist"), l.FlannelCNIConfig(n), 0o644},
			{filepath.Join(l.vmShare(n), "guest.sh"), l.guestScript(n, bin), 0o755},
		}
		for _, f := range files {
			if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(f.path, []byte(f.text), f.mode); err != nil {
				return err
			}
		}
		go func() { errs <- l.bootGuest(ctx, n, initPath, logf) }()
	}
	var all []error
	for range l.Nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// bootGuest starts node n's guest in the node network (where its tap is)
// and waits for the guest's started marker.
func (l Layout) bootGuest(ctx context.Context, n Node, initPath string, logf func(string, ...any)) error {
	start := time.Now()
	d, err := l.startDaemonEnv("vm-"+n.Name, l.NodeNet, l.UMLArgs(n, initPath), []string{"TMPDIR=/dev/shm"})
	if err != nil {
		return err
	}
	results := filepath.Join(l.vmShare(n), "results.log")
	err = poll(ctx, 40*time.Minute, func() (bool, error) {
		if d.exited() {
			tail, _ := output(ctx, "tail", "-n", "20", results)
			return false, fmt.Errorf("the guest of %s stopped; its output ends:\n%s", n.Name, tail)
		}
		_, err := os.Stat(filepath.Join(l.vmShare(n), guestStarted))
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w (guest output in %s)", n.Name, err, results)
	}
	logf("%s: guest booted, images imported, kubelet started in %v", n.Name, time.Since(start).Round(time.Second))
	return nil
}

// RunGuestNode is the node's side, in its guest: it gives the guest's
// network namespace the node's name, configures eth0 as a namespace
// node's, creates the cgroup root, moves the node's directory to a tmpfs
// (containerd's overlay snapshots cannot sit on the guest's overlay root)
// and the logs to the host, starts containerd, imports the images and
// starts kubelet, then says so in the share and waits for ctx.
func (l Layout) RunGuestNode(ctx context.Context, name string, logf func(string, ...any)) error {
	n, ok := l.node(name)
	if !ok {
		return fmt.Errorf("no node %q in this layout", name)
	}
	one := l
	one.Nodes = []Node{n}
	steps := [][]string{
		{"mkdir", "-p", netnsDir},
		{"touch", NetNSPath(n.Name)},
		{"mount", "--bind", "/proc/self/ns/net", NetNSPath(n.Name)},
		{"ip", "link", "set", "lo", "up"},
	}
	steps = append(steps, l.nodeNetworkSteps(n)...)
	steps = append(steps, l.guestMountSteps(n)...)
	for _, argv := range steps {
		if err := run(ctx, argv...); err != nil {
			return err
		}
	}
	if err := one.createCgroupRoots(); err != nil {
		return err
	}
	logf("%s: network, cgroups and directories ready", n.Name)
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		return err
	}
	refs, err := l.requiredImages(imgs)
	if err != nil {
		return err
	}
	if err := l.startNode(ctx, n, "", l.guestImages(l.nodeImages(imgs)), logf); err != nil {
		return err
	}
	missing, err := l.missingImages(ctx, n, []string{refs.pause, refs.proxy, refs.coredns, refs.agnhost, refs.flannel})
	if err != nil || len(missing) > 0 {
		return fmt.Errorf("images missing after the import: %v %v", missing, err)
	}
	if err := os.WriteFile(filepath.Join("/mnt/share", guestStarted), nil, 0o644); err != nil {
		return err
	}
	logf("%s: kubelet started", n.Name)
	<-ctx.Done()
	return nil
}

// Which images a guest imports. A guest's import is slow (about a minute
// for each 100 MB archive in user-mode Linux), so a run whose specs need
// only the images every cluster runs (the CI subset) imports just those.
const (
	GuestImagesAll  = ""
	GuestImagesCore = "core"
)

// guestImages is imgs, or with GuestImagesCore only the sandbox, the
// proxy, CoreDNS, agnhost (the suite's server and client) and flannel.
func (l Layout) guestImages(imgs []Image) []Image {
	if l.GuestImages != GuestImagesCore {
		return imgs
	}
	core := map[string]bool{"pause": true, "coredns": true, "agnhost": true,
		"flannel": true, "flannel-cni-plugin": true, l.proxyImage(): true}
	var out []Image
	for _, im := range imgs {
		if core[imageName(im.Ref)] {
			out = append(out, im)
		}
	}
	return out
}

// guestMountSteps put the node's directory on a tmpfs (its files copied
// over) and the host's logs directory in place of the guest's copy.
func (l Layout) guestMountSteps(n Node) [][]string {
	dir, saved := l.NodeDir(n), "/tmp/knp-node-"+n.Name
	logs := l.logsDir()
	return [][]string{
		{"cp", "-a", dir, saved},
		{"mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", dir},
		{"cp", "-a", saved + "/.", dir},
		{"rm", "-rf", saved},
		{"mkdir", "-p", logs},
		{"mount", "-t", "hostfs", "-o", logs, "none", logs},
	}
}

func (l Layout) node(name string) (Node, bool) {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}
