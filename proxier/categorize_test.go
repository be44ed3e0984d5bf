package proxier

import (
	"net/netip"
	"testing"
)

func TestClusterEndpoints(t *testing.T) {
	ep := func(last byte, ready, serving, terminating bool) Endpoint {
		return Endpoint{Addr: netip.AddrFrom4([4]byte{10, 0, 0, last}), Port: 80, Ready: ready, Serving: serving, Terminating: terminating}
	}
	tests := []struct {
		name string
		eps  []Endpoint
		want []byte // last octets
	}{
		{"ready only", []Endpoint{ep(1, true, true, false), ep(2, false, false, false)}, []byte{1}},
		{"ready wins over terminating", []Endpoint{ep(1, true, true, false), ep(2, false, true, true)}, []byte{1}},
		{"serving terminating when none ready", []Endpoint{ep(2, false, true, true), ep(3, false, false, true)}, []byte{2}},
		{"never not serving", []Endpoint{ep(3, false, false, true), ep(4, false, false, false)}, nil},
		{"none", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ClusterEndpoints(tt.eps)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want last octets %v", got, tt.want)
			}
			for i, e := range got {
				if e.Addr.As4()[3] != tt.want[i] {
					t.Errorf("got %v, want last octets %v", got, tt.want)
				}
			}
		})
	}
}
