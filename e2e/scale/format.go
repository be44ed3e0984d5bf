package scale

import "fmt"

// Secs formats a duration in seconds for the benchmark tables ("-" for 0).
func Secs(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s < 0.01:
		return fmt.Sprintf("%.2f ms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

// Ratio formats upstream's figure over ours ("-" when either is unknown).
func Ratio(upstream, ours float64) string {
	if upstream == 0 || ours == 0 {
		return "-"
	}
	q := upstream / ours
	if q < 10 {
		return fmt.Sprintf("%.1fx", q)
	}
	return fmt.Sprintf("%.0fx", q)
}
