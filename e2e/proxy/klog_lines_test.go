package proxy

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The proxy logs as kube-proxy does: klog's text format, a header
// (severity I, W or E, date, time, thread id, file:line) then the quoted
// message and key=value pairs, strings quoted:
//
//	W1127 04:56:13.180867   19306 errlog.go:52] "cannot read ..." source="api" err="..."

// klogHeader matches the header of a klog text line.
var klogHeader = regexp.MustCompile(`^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ [\w.-]+:\d+\] `)

// logSeverity is the severity letter of a klog text line (I, W, E), or 0
// for a line that is not one.
func logSeverity(l string) byte {
	m := klogHeader.FindStringSubmatch(l)
	if m == nil {
		return 0
	}
	return m[1][0]
}

func isInfoLine(l string) bool    { return logSeverity(l) == 'I' }
func isWarningLine(l string) bool { return logSeverity(l) == 'W' }
func isErrorLine(l string) bool   { return logSeverity(l) == 'E' }

// isLogMsg reports whether l is a klog text line with the message msg.
func isLogMsg(l, msg string) bool {
	loc := klogHeader.FindStringIndex(l)
	return loc != nil && strings.HasPrefix(l[loc[1]:], strconv.Quote(msg))
}

// isSyncedLine reports whether l is the proxy's line for a sync that
// changed the kernel's rules.
func isSyncedLine(l string) bool { return isLogMsg(l, "synced") }

// warningLines are the warnings among lines.
func warningLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if isWarningLine(l) {
			out = append(out, l)
		}
	}
	return out
}

// logTime is the time in a klog text line's header, in the local time
// zone and the current year (the header has no year); ok is false for a
// line that is not one.
func logTime(l string) (at time.Time, ok bool) {
	if logSeverity(l) == 0 {
		return time.Time{}, false
	}
	now := time.Now()
	at, err := time.ParseInLocation("0102 15:04:05.000000", l[1:21], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(now.Year(), 0, 0), true
}
