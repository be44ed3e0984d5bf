package migrate

import (
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// ExpectFromState is what the objects say beyond our rendered ruleset:
// each Service port's health check node port (Services with
// externalTrafficPolicy Local that have one).
func ExpectFromState(st *model.State) Expect {
	want := Expect{HealthCheckNodePorts: map[string]uint16{}}
	for name, svc := range st.Services.All() {
		if svc.ExternalPolicyLocal && svc.HealthCheckNodePort != 0 {
			want.HealthCheckNodePorts[name.String()] = svc.HealthCheckNodePort
		}
	}
	return want
}
