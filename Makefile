# kube-nftproxy: build, test, benchmark and demo.
GO      ?= go
BIN     := bin
PKGS    := ./...
STATICCHECK_VERSION ?= v0.8.2

# The release and commit that `kube-nftproxy version`, --version and
# kubernetes_build_info report: hack/version.sh (the newest v* tag's git
# describe, v0.0.0-<commits>-g<hash> before the first). The go command does
# not stamp VCS information in a git worktree (nor with -buildvcs=false), so
# they are passed explicitly.
VERSION ?= $(shell hack/version.sh 2>/dev/null)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.release=$(VERSION) -X main.commit=$(COMMIT)
# -trimpath: no path of the build machine in the binary, so that the same
# commit builds the same bytes wherever it is checked out.
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)"
IMAGE   ?= kube-nftproxy

.PHONY: all build image image-check test unit e2e vm-test lint fuzz bench bench-scale bench-idle bench-latency bench-ipvs bench-dataplane soak demo clean
.PHONY: cluster cluster-down cluster-status cluster-build cluster-images cluster-images-test conformance cluster-test cluster-test-ipvs cluster-faults flakes

all: build

build:
	$(GOBUILD) -o $(BIN)/ ./cmd/kube-nftproxy

# The DaemonSet's image without a container engine (hack/image.sh): an OCI
# image layout archive at IMAGE_OUT holding linux/amd64 and linux/arm64,
# named $(IMAGE):$(VERSION), stamped like make build and reproducible (the
# same commit, the same digest, printed last). Import it with
# `ctr -n k8s.io images import`, docker load or podman load, or push it
# with skopeo or crane (README.md). image-check builds it twice from
# scratch and compares the digests.
IMAGE_OUT       ?= $(BIN)/kube-nftproxy-image.tar
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
image:
	VERSION=$(VERSION) COMMIT=$(COMMIT) IMAGE=$(IMAGE) IMAGE_OUT=$(IMAGE_OUT) \
		IMAGE_PLATFORMS="$(IMAGE_PLATFORMS)" GO=$(GO) hack/image.sh

image-check:
	@set -e; rm -f $(IMAGE_OUT) $(IMAGE_OUT).stamp; a=$$($(MAKE) -s image | tail -1); \
		rm -f $(IMAGE_OUT) $(IMAGE_OUT).stamp $(BIN)/image/*/kube-nftproxy; b=$$($(MAKE) -s image | tail -1); \
		echo "first:  $$a"; echo "second: $$b"; \
		if [ "$${a##* }" != "$${b##* }" ]; then echo "image-check: the digests differ"; exit 1; fi; \
		if grep -q -a "$(CURDIR)" $(BIN)/image/*/kube-nftproxy; then echo "image-check: a build path in the binary"; exit 1; fi; \
		echo "image-check: the same digest twice, no build path in the binaries"

# Parallel tests per package in make test: the e2e tests mostly wait on
# the proxy, traffic and timers, so four at once on two cores finish
# e2e/proxy in two thirds of the time two take (635 s against 945 s, both
# beside a conformance run).
TEST_PARALLEL ?= 4

# Everything CI runs: lint, unit tests, and the kernel tests (root) in
# network namespaces the tests create and delete; then, side by side
# (hack/lanes.sh), the kernel tests again on Debian's 6.1 and 5.10 kernels
# in a QEMU VM (root: it installs and caches what it needs), and the
# cluster tier's subset on a real cluster (root; it skips, saying so, while
# the cluster cache is cold, unless KNP_REQUIRE_CLUSTER=1 as CI sets)
# followed by a short fuzz run (the VM tier is the longer lane).
test: build lint
	$(GO) test -count=1 -timeout 30m -parallel $(TEST_PARALLEL) $(PKGS)
	@if [ "$$(id -u)" = 0 ]; then \
		hack/lanes.sh $(BIN)/lanes "vm-test=$(MAKE) --no-print-directory vm-test" \
			"cluster-test-then-fuzz=$(MAKE) --no-print-directory cluster-test fuzz"; \
	else echo "vm-test and cluster-test skipped: they need root"; $(MAKE) fuzz; fi

# A short run of each fuzz target beyond its seed corpus (the corpus itself
# runs with the unit tests). Budgets are execution counts, not durations: Go
# 1.26's fuzz coordinator can report a duration's end as "context deadline
# exceeded" on a loaded machine (go.dev/issue/75804, fixed in Go 1.27).
# FUZZ_SCALE=10 for a run ten times longer.
FUZZ_SCALE ?= 1
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeState$$' -fuzztime $$((50000 * $(FUZZ_SCALE)))x -fuzzminimizetime 2000x ./source/filesource/
	$(GO) test -run '^$$' -fuzz '^FuzzBuildEncode$$' -fuzztime $$((20000 * $(FUZZ_SCALE)))x -fuzzminimizetime 2000x ./nft/

unit:
	$(GO) test -count=1 -short $(PKGS)

e2e: build
	$(GO) test -count=1 -timeout 30m -v ./e2e/...

# The kernel tests again on Debian's kernels (with IPVS and modules), in a
# QEMU VM (root), one boot per kernel in VM_KERNELS: 6.1 is Debian 12's (the
# host's apt sources), 5.10 Debian 11's (bullseye, our minimum kernel,
# through an apt configuration of its own). The first run installs qemu and
# caches each kernel and initramfs under /var/cache/kube-nftproxy/vm; see
# hack/vm/README.md. One kernel: make vm-test-5.10 (or VM_KERNELS=6.1).
# One package's tests there: hack/vm/run.sh ./nft -run TestKernel -v
# (KNP_VM_SUITE=bullseye for 5.10).
VM_PKGS    ?= ./internal/... ./sysctl ./sysctlrecord ./conntrack ./nftlib ./nft ./ipvs
VM_FLAGS   ?=
# What the VM tier leaves to the host's kernel: four nft tests that repeat
# the repair logic over dozens of tamperings and foreign objects (together
# most of the guest's time). What of them depends on the kernel (its dumps
# of our rules and of foreign objects, its change events) runs in the guest
# too: TestKernelRuleDumpCanonical, TestKernelForeignChangeRepairedAtOnce,
# TestKernelChangeRepairedInPlace, nftlib's TestKernelScopedDrift and
# TestKernelTableDriftForeign. VM_SKIP= runs everything.
VM_SKIP    ?= ^(TestKernelTamperingRepaired|TestKernelTamperingRepairedByRestart|TestKernelForeignObjectsAtStartup|TestKernelForeignObjectsRepaired)$$
# On 5.10, beyond VM_SKIP, the guest leaves out what does not differ between
# kernels: the sync loop's settling and folding over the kernel, the address
# listing, and the node-pressure tests of the real binary. What talks to the
# kernel in ways a version can change (encodings and dumps, notifications,
# feature probes, ownership, IPVS, conntrack, the IPVS mode's binary) runs
# there; the rest runs on 6.1 and the host. VM_SKIP_5.10= runs everything.
VM_SKIP_5.10 ?= ^(TestKernelFullSyncDefersSettle|TestKernelFullSyncSettles|TestKernelElementChangeRepairedInPlace|TestKernelStaleChainsDeletedOnTime|TestKernelDeltaAndFold|TestKernelFoldWithChanges|TestKernelStateChanges|TestKernelAddrsExcept|TestVMConntrackFull|TestVMClockStep)$$
# On 6.1, beyond VM_SKIP, the three tests that hold most of the guest's
# time (168 of its 344 s in nft, nftlib and netns) and that 5.10 leaves out
# too: the settling of a full sync at scale and the address listing. They
# run on the host's kernel. VM_SKIP_6.1= runs them.
VM_SKIP_6.1 ?= ^(TestKernelFullSyncDefersSettle|TestKernelFullSyncSettles|TestKernelAddrsExcept)$$
# Seconds for one boot: make test runs the VM beside the cluster tier,
# where its emulated CPU runs 2-3 times slower (6.1's packages: 521 s).
VM_TIMEOUT ?= 1500
VM_KERNELS ?= 6.1 5.10
vm_suite_6.1  :=
vm_suite_5.10 := bullseye
# vm_skip: VM_SKIP and the kernel's own VM_SKIP_<kernel>, as one -skip.
vm_skip = $(subst $(eval) ,|,$(strip $(VM_SKIP) $(VM_SKIP_$(1))))
vm-test: $(addprefix vm-test-,$(VM_KERNELS))
vm-test-%:
	@case " 6.1 5.10 " in *" $* "*) ;; *) echo "vm-test: no VM kernel $* (have 6.1 5.10)"; exit 2 ;; esac
	KNP_VM_SUITE=$(vm_suite_$*) KNP_VM_TIMEOUT=$(VM_TIMEOUT) GO=$(GO) hack/vm/run.sh $(VM_PKGS) $(if $(call vm_skip,$*),-skip '$(call vm_skip,$*)') $(VM_FLAGS)
	# The real binary in IPVS mode (its other tests read files outside the package).
	KNP_VM_SUITE=$(vm_suite_$*) KNP_VM_TIMEOUT=$(VM_TIMEOUT) GO=$(GO) hack/vm/run.sh ./cmd/kube-nftproxy -run '^TestVM' $(if $(VM_SKIP_$*),-skip '$(VM_SKIP_$*)') $(VM_FLAGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@if ! command -v staticcheck >/dev/null 2>&1 && [ ! -x "$$($(GO) env GOPATH)/bin/staticcheck" ]; then \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); fi
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck $(PKGS)

# Benchmarks of the nftables mode (./nft: ruleset building, no root; kernel
# syncs in a namespace, root) and of the conntrack cleanup (root).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x -timeout 60m ./nft/ ./conntrack/

# Upstream kube-proxy v1.37.1 (nftables mode) and ours side by side against
# a real API server holding each shape of KNP_SCALE_SIZES: "N" is N
# Services x 10 endpoints, "NxE" N Services x E (e.g. 5000x50,44000x1);
# every 10th a NodePort. Each proxy in a fresh network namespace (root):
# start to first sync (ours: beside the kernel's commit of it), one Service
# added and one endpoint moved five times (sync, and until real traffic
# reaches the new backend; medians, beside the kernel's smallest commit),
# CPU, peak and steady RSS, kernel objects. One table, also written to KNP_SCALE_OUT; proxy logs
# kept in KNP_SCALE_LOGS (a directory). Upstream's first sync is waited for
# KNP_SCALE_BOUND at most, then shown as a lower bound.
KNP_SCALE_SIZES   ?= 1000,5000,10000
KNP_SCALE_BOUND   ?= 10m
KNP_SCALE_PROXIES ?= ours,upstream
KNP_SCALE_OUT     ?=
# abs: a path the benchmarks' tests (run in their package's directory) can
# write to when it was given relative to this one; empty stays empty.
abs = $(if $(1),$(abspath $(1)))
bench-scale:
	hack/kube-proxy/build.sh
	KNP_SCALE_BENCH=1 KNP_SCALE_SIZES=$(KNP_SCALE_SIZES) KNP_SCALE_BOUND=$(KNP_SCALE_BOUND) \
		KNP_SCALE_PROXIES=$(KNP_SCALE_PROXIES) KNP_SCALE_OUT=$(call abs,$(KNP_SCALE_OUT)) \
		$(GO) test -count=1 -v -timeout 4h -run '^TestNFTablesSideBySide$$' ./e2e/nftbench/

# Idle cost: upstream kube-proxy v1.37.1 (nftables mode) and ours started at
# once, each in its own node namespace against one real API server holding
# N Services x 10 endpoints; after their first syncs and KNP_IDLE_SETTLE,
# their CPU (utime+stime, children included) and wakeups (context switches
# over all threads) over KNP_IDLE_WINDOW in which nothing changes, as CPU
# seconds per hour and wakeups per minute (root). One table, also written
# to KNP_IDLE_OUT; ours' CPU profile of a second window in KNP_IDLE_PROFILE
# (a directory) when set. KNP_IDLE_BASELINE=path runs another build of
# kube-nftproxy alongside (e.g. main's, to compare a change). KNP_IDLE_ARGS
# (split at spaces) is added to every proxy's flags.
KNP_IDLE_SIZES   ?= 10000
KNP_IDLE_WINDOW  ?= 120s
KNP_IDLE_SETTLE  ?= 45s
KNP_IDLE_OUT     ?=
KNP_IDLE_PROFILE ?=
KNP_IDLE_BASELINE ?=
bench-idle:
	hack/kube-proxy/build.sh
	KNP_IDLE_BENCH=1 KNP_IDLE_SIZES=$(KNP_IDLE_SIZES) KNP_IDLE_WINDOW=$(KNP_IDLE_WINDOW) \
		KNP_IDLE_SETTLE=$(KNP_IDLE_SETTLE) KNP_IDLE_OUT=$(call abs,$(KNP_IDLE_OUT)) KNP_IDLE_PROFILE=$(call abs,$(KNP_IDLE_PROFILE)) KNP_IDLE_BASELINE=$(KNP_IDLE_BASELINE) \
		KNP_SCALE_BOUND=$(KNP_SCALE_BOUND) KNP_SCALE_PROXIES=$(KNP_SCALE_PROXIES) \
		$(GO) test -count=1 -v -timeout 4h -run '^TestNFTablesIdle$$' ./e2e/nftbench/

# Network programming latency across many nodes: one real API server holding
# KNP_LATENCY_SERVICES Services x 10 endpoints and KNP_LATENCY_NODES proxies
# of one kind at a time (ours, then upstream v1.37.1 in nftables mode), each
# in its own node namespace; after their first syncs, KNP_LATENCY_RATE
# changes a second for KNP_LATENCY_WINDOW (an endpoint replaced by a fresh
# address; every 5th a Service created). For each change and node, the
# time from the API write to its address read back from the node's kernel
# (nf_tables notifications), p50/p99/max; beside it the proxies' own
# network_programming_duration histograms merged, the API server's CPU and
# the bytes it sent the nodes over the window, and over the start (their
# lists and watches, per node) (root). One table, also
# written to KNP_LATENCY_OUT; first syncs waited for KNP_SCALE_BOUND.
# KNP_IDLE_ARGS adds flags to every proxy (as for bench-idle), e.g.
# KNP_IDLE_ARGS=--iptables-min-sync-period=500ms KNP_LATENCY_PROXIES=ours.
KNP_LATENCY_NODES    ?= 50
KNP_LATENCY_SERVICES ?= 5000
KNP_LATENCY_RATE     ?= 5
KNP_LATENCY_WINDOW   ?= 60s
KNP_LATENCY_PROXIES  ?= ours,upstream
KNP_LATENCY_OUT      ?=
bench-latency:
	hack/kube-proxy/build.sh
	KNP_LATENCY_BENCH=1 KNP_LATENCY_NODES=$(KNP_LATENCY_NODES) KNP_LATENCY_SERVICES=$(KNP_LATENCY_SERVICES) \
		KNP_LATENCY_RATE=$(KNP_LATENCY_RATE) KNP_LATENCY_WINDOW=$(KNP_LATENCY_WINDOW) \
		KNP_LATENCY_PROXIES=$(KNP_LATENCY_PROXIES) KNP_LATENCY_OUT=$(call abs,$(KNP_LATENCY_OUT)) KNP_SCALE_BOUND=$(KNP_SCALE_BOUND) \
		$(GO) test -count=1 -v -timeout 4h -run '^TestNetworkProgrammingLatency$$' ./e2e/nftbench/

# The same in IPVS mode, each proxy in a fresh QEMU VM with real IPVS (root;
# about an hour): e2e/ipvsbench, KNP_IPVS_BENCH_SIZES, KNP_IPVS_BENCH_BOUND.
bench-ipvs:
	KNP_IPVS_BENCH=1 $(GO) test -count=1 -v -timeout 4h -run TestIPVSSideBySide ./e2e/ipvsbench/

# First-packet latency of new TCP connections and UDP requests to a
# ClusterIP against the same flows straight to the pod, from a pod and
# from the node, with N Services x 10 endpoints programmed (root;
# e2e/dataplane): one sandbox per size and one without any ruleset, all
# alive at once, sampled interleaved. One table, also written to KNP_DATAPLANE_OUT. Add 50000 to
# the sizes for 50k (its full sync takes about half a minute here).
KNP_DATAPLANE_SIZES   ?= 100,1000,10000
KNP_DATAPLANE_SAMPLES ?= 2000
KNP_DATAPLANE_OUT     ?=
bench-dataplane:
	KNP_DATAPLANE_BENCH=1 KNP_DATAPLANE_SIZES=$(KNP_DATAPLANE_SIZES) KNP_DATAPLANE_SAMPLES=$(KNP_DATAPLANE_SAMPLES) \
		KNP_DATAPLANE_OUT=$(KNP_DATAPLANE_OUT) \
		$(GO) test -count=1 -v -timeout 1h -run '^TestDataplaneLatency$$' ./e2e/dataplane/

# The soak (e2e/proxy TestSoak; root): the proxy against a real API server
# for SOAK with SOAK_SERVICES Services (a tenth NodePorts) under four flows
# (TCP and UDP to two ClusterIPs from a pod and to their NodePorts from the
# external client, a request every 50ms each), five changes a second of
# endpoints and Services, and in turn every 3 minutes the API server killed
# and restarted, etcd killed and restarted, and the API server SIGSTOPped
# for 60s. It prints the SOAK summary (requests, failed, longest gap,
# changes, the proxy's RSS, goroutines, fds and threads at start and end)
# and fails on any failed request, on fds or goroutines growing, or if the
# kernel does not end up with exactly the API server's Services. The whole
# log goes to SOAK_LOG. A one-minute version runs with the other tests.
SOAK          ?= 30m
SOAK_SERVICES ?= 1000
SOAK_LOG      ?= $(BIN)/soak.log
soak:
	hack/apiserver/build.sh
	@mkdir -p $(dir $(SOAK_LOG)); echo "soak: $(SOAK), $(SOAK_SERVICES) Services; the whole log in $(SOAK_LOG)"
	@status=0; KNP_SOAK=$(SOAK) KNP_SOAK_SERVICES=$(SOAK_SERVICES) KNP_REQUIRE_APISERVER=1 \
		$(GO) test -count=1 -v -timeout 24h -run '^TestSoak$$' ./e2e/proxy/ > $(SOAK_LOG) 2>&1 || status=$$?; \
		grep -E 'soak_test\.go|soak_helpers_test\.go|logged an error|^--- |^(ok|FAIL)' $(SOAK_LOG); exit $$status

# The real two-node cluster's binaries (hack/cluster/build.sh: Kubernetes
# v1.37.1 with agnhost and e2e.test, etcd, containerd, CoreDNS, flannel and
# the CNI plugins), cached in /var/cache/kube-nftproxy; about 21 minutes
# cold on 2 cores, nothing when cached. CLUSTER_PARTS picks parts (k8s etcd
# containerd coredns flannel metallb, or single Kubernetes binaries); all
# builds metallb only with KNP_CLUSTER_LB=metallb.
CLUSTER_PARTS ?= all
cluster-build:
	hack/cluster/build.sh $(CLUSTER_PARTS)

demo:
	$(GOBUILD) -o $(BIN)/ ./cmd/kube-nftproxy ./e2e/demo
	$(GO) build -o $(BIN)/e2e-agent ./e2e/agent
	$(BIN)/demo --proxy $(BIN)/kube-nftproxy --agent $(BIN)/e2e-agent --state examples/demo $(DEMO_FLAGS)

clean:
	rm -rf $(BIN)

# The test cluster's container images as docker archives in
# $KNP_CACHE/cluster/images (hack/cluster/images.sh; run cluster-build
# first), kube-nftproxy's being make image's OCI archive under the
# cluster's names, and the image tool's own tests (a separate Go module).
cluster-images:
	hack/cluster/images.sh

cluster-images-test:
	cd hack/cluster/images && GOWORK=off GOFLAGS=-mod=mod $(GO) test -count=1 ./...

# A real two-node Kubernetes v1.37.1 cluster on this machine (root), with
# kube-nftproxy from deploy/ as its only service proxy: control plane in
# network namespace "nodenet", nodes node1 and node2 in their own, each with
# its own containerd and kubelet; binaries and images from
# hack/cluster/build.sh and hack/cluster/images.sh under KNP_CACHE. Prints
# each node Ready, the DaemonSet pod on each, and a smoke check.
# hack/cluster/kubectl.sh talks to it; make cluster-down removes it all.
# KNP_CLUSTER_FAMILY=dual (or ipv6) makes it dual-stack (IPv6 single-stack);
# the default is ipv4. KNP_CLUSTER_NODES=3 (to 6) adds nodes, in zones
# zone-a, zone-b, zone-c in turn; KNP_CLUSTER_CNI=bridge swaps flannel for
# the CNI bridge plugin; KNP_CLUSTER_LB=metallb adds MetalLB (L2 mode) as
# the load balancer. make conformance takes the same variables.
# From nothing it first builds what is not cached (cluster-build, about 21
# minutes cold; cluster-images, about a minute).
cluster: cluster-build cluster-images
	$(call ipvs_guests,$(KNP_CLUSTER_PROXY)) $(GO) run ./e2e/cluster/cmd up

# IPVS mode's proxies (ipvs, upstream-ipvs) on a kernel without IPVS: each
# node a user-mode Linux guest whose kernel has it (hack/vm/README.md;
# uml-kernel.sh builds it once, about 15 minutes).
ipvs_guests = $(if $(filter ipvs upstream-ipvs,$(1)),$(if $(wildcard /proc/net/ip_vs),,KNP_CLUSTER_NODE_KERNEL=$$(hack/vm/uml-kernel.sh)))

cluster-down:
	$(GO) run ./e2e/cluster/cmd down

cluster-status:
	$(GO) run ./e2e/cluster/cmd status

# Upstream's e2e.test v1.37.1 on the cluster: all [sig-network] Services
# specs, the sig-network [Conformance] set and the other proxy specs
# (Networking Granular Checks, Conntrack, KubeProxy), minus what cannot run
# here (hack/cluster/conformance.sh names each skip and its reason), on 4
# ginkgo processes; JUnit report and log in bin/conformance/$(PROXY).
# PROXY=privileged runs deploy/ with deploy/privileged/patch.yaml (the
# conntrack sysctls set); PROXY=upstream runs kube-proxy v1.37.1 (iptables
# mode) as the baseline, PROXY=upstream-nftables the same in nftables mode;
# PROXY=kubeadm runs the same kubeadm objects with only the image changed to
# ours (the drop-in). PROXY=ipvs and PROXY=upstream-ipvs run IPVS mode, on
# user-mode Linux guest nodes when this kernel has no IPVS (docs/cluster.md).
# Brings the cluster up with that proxy if none is up; leaves it up.
PROXY ?= ours
conformance: cluster-build cluster-images
	PROXY=$(PROXY) $(call ipvs_guests,$(PROXY)) hack/cluster/conformance.sh

# The same selection RUNS times back to back on one cluster
# (hack/cluster/flakes.sh): per run the JUnit report, e2e.test's log, the
# proxy pods' logs and the events, and a table of the failures; the flake
# rate in docs/cluster.md comes from it.
RUNS ?= 5
flakes: cluster-build cluster-images
	RUNS=$(RUNS) PROXY=$(PROXY) $(call ipvs_guests,$(PROXY)) hack/cluster/flakes.sh

# The cluster tier's CI subset (e2e/cluster TestClusterConformanceSubset):
# a dual-stack cluster of three nodes in three zones up, the smoke check,
# upstream's 15 Services [Conformance] specs, the secondary family's
# pod-to-Service checks and the zone-aware specs, and with MetalLB (when
# cached: it says so otherwise) six load balancer specs, the cluster down; then
# the two-node IPv4 cluster with kubeadm's kube-proxy objects
# and our image (TestClusterKubeadmDropIn: the 3 LocalhostNodePorts specs
# and 2 Services specs); then deploy/ in nftables mode with the
# KubeProxyNFTablesLocalhostNodePorts gate (TestClusterLocalhostNodePorts:
# the same 3 specs, answered in userspace); about 8 minutes with a warm
# cache; it skips, saying what is missing, when the binaries or images are
# not cached. It waits its turn on /run/knp-cluster.lock: one cluster on a
# machine at a time. KNP_CLUSTER_AWAIT (set by .ci/run on a cold cache) is
# the status file of the builds to wait for, until KNP_CLUSTER_AWAIT_UNTIL
# (hack/cluster/await-build.sh); past that the tier is skipped, saying why.
cluster-test:
	@skip=; \
	if [ -n "$$KNP_CLUSTER_AWAIT" ]; then \
		skip=$$(hack/cluster/await-build.sh "$$KNP_CLUSTER_AWAIT" "$$KNP_CLUSTER_AWAIT_UNTIL") || exit 1; fi; \
	if [ -n "$$skip" ]; then echo "cluster-test skipped: $$skip"; else \
		flock /run/knp-cluster.lock env KNP_CLUSTER_TIER=1 $(GO) test -count=1 -v -timeout 45m -run '^(TestClusterConformanceSubset|TestClusterKubeadmDropIn|TestClusterLocalhostNodePorts)$$' ./e2e/cluster/; fi

# IPVS mode as the proxy of a two-node cluster whose nodes are user-mode
# Linux guests (TestClusterIPVSModeInGuests: a ClusterIP, a NodePort and
# session affinity through it), once hack/vm/uml-kernel.sh has built their
# kernel. Not in make test: on two cores the guests take 20-30 minutes to
# come up and run it, and the VM tier runs IPVS mode on real IPVS already.
cluster-test-ipvs:
	hack/vm/uml-kernel.sh >/dev/null
	flock /run/knp-cluster.lock env KNP_CLUSTER_TIER=1 KNP_REQUIRE_CLUSTER=1 $(GO) test -count=1 -v -timeout 60m -run '^TestClusterIPVSModeInGuests$$' ./e2e/cluster/

# The real-cluster faults (e2e/cluster faults_*_test.go), with a client
# pod on node1 sending TCP and UDP requests to a ClusterIP and to both
# nodes' NodePort (backends on node2), and six long-lived flows held open
# across every fault: our DaemonSet pods deleted 10 times, the DaemonSet
# rolled to another build, an unrelated endpoint removed, a port added, the
# kubelets, the API server and etcd restarted; and docs/migration.md's steps
# from upstream kube-proxy (iptables mode; nftables mode), the way back and
# forward again; deploy/cleanup/ after our DaemonSet is deleted. FAULT and
# FLOWS lines each; each brings a cluster up and down, holding
# /run/knp-cluster.lock for each test alone. FAULTS picks (Restarts,
# Migration, MigrationNFTables, Cleanup; TokenRotation, 30 minutes: our pods
# on 10-minute tokens through three rotations).
FAULTS ?= Restarts Migration MigrationNFTables Cleanup
# Like cluster-test it builds nothing itself (its own two proxy images come
# from this tree; the rest from the cache), so it never rewrites the shared
# cache's kube-nftproxy image; a cold cache skips.
cluster-faults:
	set -e; for f in $(FAULTS); do \
		flock /run/knp-cluster.lock env KNP_CLUSTER_FAULTS=1 $(GO) test -count=1 -v -timeout 50m \
			-run "^TestClusterFault$$f\$$" ./e2e/cluster/; \
	done
