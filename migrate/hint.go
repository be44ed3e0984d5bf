package migrate

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A dump of kube-proxy run with --cluster-cidr compared with ours without
// it: every Service port's policy chain masquerades "saddr != CIDR" in
// iptables and nothing in ours, and eTP Local chains lack the pod short
// cut. diff then says what is probably missing instead of only counting
// the Service ports that differ.

var offClusterSource = regexp.MustCompile(`saddr != (\S+)`)

// noteClusterCIDR looks at one Service port: masquerading of off-cluster
// sources only in iptables, while ours masquerades no such range.
func (r *Report) noteClusterCIDR(theirs, ours *Facts, differences []string) {
	if len(differences) == 0 || slices.ContainsFunc(ours.Sets[catMasquerade], offClusterSource.MatchString) {
		return
	}
	onlyTheirs, _ := setDiff(theirs.Sets[catMasquerade], ours.Sets[catMasquerade])
	found := false
	for _, m := range onlyTheirs {
		if sub := offClusterSource.FindStringSubmatch(m); sub != nil {
			found = true
			if !slices.Contains(r.clusterCIDRs, sub[1]) {
				r.clusterCIDRs = append(r.clusterCIDRs, sub[1])
			}
		}
	}
	alone := found
	for _, d := range differences {
		cat, _, _ := strings.Cut(d, ":")
		alone = alone && (cat == catMasquerade || cat == catExternal)
	}
	if alone {
		r.cidrOnly++
	}
}

// hintClusterCIDR turns the notes into a hint.
func (r *Report) hintClusterCIDR() {
	if len(r.clusterCIDRs) == 0 {
		return
	}
	different := 0
	for _, res := range r.Results {
		if !res.Equal() {
			different++
		}
	}
	r.Hints = append(r.Hints, fmt.Sprintf("--cluster-cidr %s: iptables masquerades traffic to Service IPs from outside it, ours by no such range: run ours (or diff --state) with kube-proxy's --cluster-cidr; %d of the %d Service ports that differ differ by that alone",
		strings.Join(r.clusterCIDRs, ","), r.cidrOnly, different))
}
