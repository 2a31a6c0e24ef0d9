package schedule

import (
	"strings"
	"time"
)

// Retry ladder limits.
const (
	MaxLadderLevels  = 16
	MaxLadderDelayMs = 7 * 24 * 3600 * 1000 // 7 days
	MaxLadderBytes   = 512
)

// DefaultLadderMs is the retry ladder used when none is given: 1 s, 5 s,
// 30 s, 2 min, then dead-letter. Treat it as read-only; ParseLadder("")
// returns a copy.
var DefaultLadderMs = []int64{1000, 5000, 30000, 120000}

// ParseLadder parses a comma-separated list of Go durations ("1s,5s,30s,2m")
// into milliseconds. Each level must be a whole number of milliseconds, at
// least 1 ms and at most MaxLadderDelayMs; at most MaxLadderLevels levels.
// Spaces around levels are ignored. "" (or only spaces) gives a copy of
// DefaultLadderMs. Errors name FieldLadder.
func ParseLadder(s string) ([]int64, error) {
	if len(s) > MaxLadderBytes {
		return nil, invalid(FieldLadder, "%d bytes, the limit is %d", len(s), MaxLadderBytes)
	}
	if strings.TrimSpace(s) == "" {
		return append([]int64(nil), DefaultLadderMs...), nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxLadderLevels {
		return nil, invalid(FieldLadder, "%d levels, the limit is %d", len(parts), MaxLadderLevels)
	}
	out := make([]int64, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, invalid(FieldLadder, "level %d is empty", i+1)
		}
		d, err := time.ParseDuration(p)
		if err != nil {
			return nil, invalid(FieldLadder, "level %d %q is not a duration such as 5s or 2m", i+1, p)
		}
		if d <= 0 {
			return nil, invalid(FieldLadder, "level %d %q is not positive", i+1, p)
		}
		if d%time.Millisecond != 0 {
			return nil, invalid(FieldLadder, "level %d %q is not a whole number of milliseconds", i+1, p)
		}
		if d > MaxLadderDelayMs*time.Millisecond {
			return nil, invalid(FieldLadder, "level %d %q is over the limit of 168h (7 days)", i+1, p)
		}
		out = append(out, d.Milliseconds())
	}
	return out, nil
}
