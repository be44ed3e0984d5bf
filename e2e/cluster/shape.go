package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The number of nodes, by KNP_CLUSTER_NODES.
const (
	defaultNodes = 2
	maxNodes     = 6 // three zones of two nodes: the most any spec asks for
	// zoneCount is how many zones a cluster of three or more nodes spans:
	// upstream's traffic-distribution specs skip themselves below three.
	zoneCount = 3
	// recordedNodesFile names the nodes Up started, so that Down finds them
	// whatever KNP_CLUSTER_NODES says when it runs.
	recordedNodesFile = "nodes"
)

// parseNodeCount reads KNP_CLUSTER_NODES: empty means the default.
func parseNodeCount(v string) (int, error) {
	if v == "" {
		return defaultNodes, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 || n > maxNodes {
		return 0, fmt.Errorf("KNP_CLUSTER_NODES=%q: want a number from 2 to %d", v, maxNodes)
	}
	return n, nil
}

// makeNodes lays out count nodes on the node network: node<i> at
// 10.200.0.1<i> and fd00:200::1<i>. Two nodes carry no zone (the shape
// the suite ran on first); three or more are spread over zone-a, zone-b
// and zone-c in turn, so three nodes give three one-node zones and six
// give three zones of two.
func makeNodes(count int) []Node {
	nodes := make([]Node, count)
	for i := range nodes {
		n := Node{
			Name: fmt.Sprintf("node%d", i+1),
			IP:   fmt.Sprintf("10.200.0.%d", 11+i),
			IP6:  fmt.Sprintf("fd00:200::%d", 11+i),
		}
		if count >= zoneCount {
			n.Zone = "zone-" + string(rune('a'+i%zoneCount))
		}
		nodes[i] = n
	}
	return nodes
}

// nodeLabelArgs are kubelet's --node-labels: the node's zone, which the
// NodeRestriction admission plugin lets a kubelet set on itself.
func nodeLabelArgs(n Node) []string {
	if n.Zone == "" {
		return nil
	}
	return []string{"--node-labels=topology.kubernetes.io/zone=" + n.Zone}
}

// recordNodes writes the names of the nodes Up is about to start.
func (l Layout) recordNodes() error {
	var names []string
	for _, n := range l.Nodes {
		names = append(names, n.Name)
	}
	return os.WriteFile(filepath.Join(l.Dir, recordedNodesFile), []byte(strings.Join(names, "\n")+"\n"), 0o644)
}

// withRecordedNodes is l with the nodes Up recorded added to its own, so
// that Down removes a cluster of another size than KNP_CLUSTER_NODES says.
func (l Layout) withRecordedNodes() Layout {
	data, err := os.ReadFile(filepath.Join(l.Dir, recordedNodesFile))
	if err != nil {
		return l
	}
	have := map[string]bool{}
	for _, n := range l.Nodes {
		have[n.Name] = true
	}
	nodes := append([]Node(nil), l.Nodes...)
	for _, name := range strings.Fields(string(data)) {
		if !have[name] {
			nodes = append(nodes, Node{Name: name})
			have[name] = true
		}
	}
	l.Nodes = nodes
	return l
}
