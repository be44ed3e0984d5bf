package proxier

// ClusterEndpoints picks the endpoints that serve cluster traffic of a
// service port: the ready ones; when there are none, the serving terminating
// ones (as kube-proxy does since graceful termination went GA); never
// endpoints that are not serving.
func ClusterEndpoints(eps []Endpoint) []Endpoint {
	var ready, terminating []Endpoint
	for _, ep := range eps {
		switch {
		case ep.Ready:
			ready = append(ready, ep)
		case ep.Serving && ep.Terminating:
			terminating = append(terminating, ep)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}
