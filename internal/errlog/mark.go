package errlog

// Mark is a warning raised once when a level reaches a high mark and
// cleared once when it falls under a lower one, so that a level hovering
// at the high mark does not repeat it: the conntrack table's fill
// (conntrack.Pressure), the live heap under the proxy's memory limit. The
// caller says where the level stands and logs what Update reports. It is
// not safe for concurrent use.
type Mark struct {
	raised bool
}

// Update is told whether the level is at the high mark (high) and under
// the low one (low); it reports whether that raised the warning (rose) or
// cleared it (fell): each once per crossing, never both.
func (m *Mark) Update(high, low bool) (rose, fell bool) {
	switch {
	case !m.raised && high:
		m.raised = true
		return true, false
	case m.raised && low:
		m.raised = false
		return false, true
	}
	return false, false
}
