package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseNodeCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		bad  bool
	}{
		{in: "", want: 2},
		{in: "2", want: 2},
		{in: "3", want: 3},
		{in: "6", want: 6},
		{in: "1", bad: true},
		{in: "7", bad: true},
		{in: "three", bad: true},
	} {
		got, err := parseNodeCount(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseNodeCount(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// describe prints nodes as "name ip ip6 zone" lines.
func describe(nodes []Node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s %s %s %s\n", n.Name, n.IP, n.IP6, n.Zone)
	}
	return b.String()
}

func TestMakeNodes(t *testing.T) {
	for _, tc := range []struct {
		count int
		want  string
	}{
		{2, "node1 10.200.0.11 fd00:200::11 \nnode2 10.200.0.12 fd00:200::12 \n"},
		{3, "node1 10.200.0.11 fd00:200::11 zone-a\nnode2 10.200.0.12 fd00:200::12 zone-b\n" +
			"node3 10.200.0.13 fd00:200::13 zone-c\n"},
		{6, "node1 10.200.0.11 fd00:200::11 zone-a\nnode2 10.200.0.12 fd00:200::12 zone-b\n" +
			"node3 10.200.0.13 fd00:200::13 zone-c\nnode4 10.200.0.14 fd00:200::14 zone-a\n" +
			"node5 10.200.0.15 fd00:200::15 zone-b\nnode6 10.200.0.16 fd00:200::16 zone-c\n"},
	} {
		if got := describe(makeNodes(tc.count)); got != tc.want {
			t.Errorf("makeNodes(%d):\n%s\nwant:\n%s", tc.count, got, tc.want)
		}
	}
}

func TestKubeletArgsLabelTheZone(t *testing.T) {
	l := Layout{Dir: "/d", Nodes: makeNodes(3)}
	args := l.KubeletArgs(l.Nodes[1])
	if !slices.Contains(args, "--node-labels=topology.kubernetes.io/zone=zone-b") {
		t.Errorf("node2's kubelet args %v lack its zone label", args)
	}
	l.Nodes = makeNodes(2)
	for _, a := range l.KubeletArgs(l.Nodes[1]) {
		if strings.HasPrefix(a, "--node-labels") {
			t.Errorf("a two-node cluster's kubelet has %s", a)
		}
	}
}

func TestDownFindsTheRecordedNodes(t *testing.T) {
	up := Layout{Dir: t.TempDir(), Nodes: makeNodes(3)}
	if err := up.recordNodes(); err != nil {
		t.Fatal(err)
	}
	down := Layout{Dir: up.Dir, Nodes: makeNodes(2)}
	if got, want := describe(down.withRecordedNodes().Nodes), "node1 10.200.0.11 fd00:200::11 \n"+
		"node2 10.200.0.12 fd00:200::12 \nnode3   \n"; got != want {
		t.Errorf("Down's nodes:\n%s\nwant:\n%s", got, want)
	}
	if err := os.Remove(filepath.Join(up.Dir, recordedNodesFile)); err != nil {
		t.Fatal(err)
	}
	if got := len(down.withRecordedNodes().Nodes); got != 2 {
		t.Errorf("without a record Down has %d nodes, want its own 2", got)
	}
}
