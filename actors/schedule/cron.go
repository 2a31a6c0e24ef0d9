package schedule

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// Cron and zone limits.
const (
	MaxCronBytes = 256
	MaxTZBytes   = 64
)

// cronHorizonSec bounds a search for the next match. A valid expression
// matches at least once in any 8 years (Feb 29 skips 2100); 10 is margin.
const cronHorizonSec = 10 * 366 * 86400

const starBit = 1 << 63

// cronParser accepts 5 fields, 6 with leading seconds, and descriptors. Only
// robfig's parser is used: its SpecSchedule.Next is not (see doc.go).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// cronSpec is a parsed expression: robfig's bit sets, evaluated by the search
// below under the DST rules in doc.go.
type cronSpec struct {
	sec, min, hour, dom, month, dow uint64
	domStar, dowStar                bool
	everyHour                       bool // hour field covers 0-23
	loc                             *time.Location
}

func parseCron(expr string) (*cronSpec, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, invalid(FieldCron, "empty; a kind cron job needs an expression")
	}
	if len(expr) > MaxCronBytes {
		return nil, invalid(FieldCron, "%d bytes, the limit is %d", len(expr), MaxCronBytes)
	}
	upper := strings.ToUpper(expr)
	if strings.HasPrefix(upper, "TZ=") || strings.HasPrefix(upper, "CRON_TZ=") {
		return nil, invalid(FieldCron, "a TZ= / CRON_TZ= prefix is not accepted; set the tz field")
	}
	if strings.HasPrefix(strings.ToLower(expr), "@every") {
		return nil, invalid(FieldCron, "@every is not accepted; use a fixed_rate job")
	}
	sched, err := safeParse(expr)
	if err != nil {
		return nil, invalid(FieldCron, "%q: %v (want 5 fields, 6 with leading seconds, or @hourly/@daily/@weekly/@monthly/@yearly/@midnight)", expr, err)
	}
	ss, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, invalid(FieldCron, "%q is not a calendar expression", expr)
	}
	c := &cronSpec{
		sec: ss.Second &^ starBit, min: ss.Minute &^ starBit, hour: ss.Hour &^ starBit,
		dom: ss.Dom &^ starBit, month: ss.Month &^ starBit, dow: ss.Dow &^ starBit,
		domStar: ss.Dom&starBit != 0, dowStar: ss.Dow&starBit != 0,
		loc: time.UTC,
	}
	const hours24 = 1<<24 - 1
	c.everyHour = c.hour&hours24 == hours24
	if !c.canMatch() {
		return nil, invalid(FieldCron, "%q never matches a real date", expr)
	}
	return c, nil
}

func safeParse(expr string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unparseable: %v", r)
		}
	}()
	return cronParser.Parse(expr)
}

// canMatch reports whether some date matches. Only an AND of day-of-month and
// month (day-of-week "*") can be impossible, e.g. "0 0 30 2 *".
func (c *cronSpec) canMatch() bool {
	if c.sec == 0 || c.min == 0 || c.hour == 0 || c.month == 0 || c.dom == 0 || c.dow == 0 {
		return false
	}
	if !c.dowStar && !c.domStar {
		return true // either may match: every month has every weekday
	}
	maxDay := [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for m := 1; m <= 12; m++ {
		if c.month&(1<<m) == 0 {
			continue
		}
		for d := 1; d <= maxDay[m]; d++ {
			if c.dom&(1<<d) != 0 {
				return true
			}
		}
	}
	return false
}

// dayMatches combines day-of-month and day-of-week as Vixie cron (and robfig)
// do: if either is "*" both must match, otherwise either may.
func (c *cronSpec) dayMatches(day int, wd time.Weekday) bool {
	domOK := c.dom&(1<<day) != 0
	dowOK := c.dow&(1<<int(wd)) != 0
	if c.domStar || c.dowStar {
		return domOK && dowOK
	}
	return domOK || dowOK
}

// nextBit returns the lowest set bit >= from and <= max.
func nextBit(set uint64, from, max int) (int, bool) {
	for i := from; i <= max; i++ {
		if set&(1<<i) != 0 {
			return i, true
		}
	}
	return 0, false
}

// nextTOD returns the first matching time of day (seconds) >= tod.
func (c *cronSpec) nextTOD(tod int) (int, bool) {
	h, m, s := tod/3600, tod/60%60, tod%60
	for ; h < 24; h, m, s = h+1, 0, 0 {
		if c.hour&(1<<h) == 0 {
			continue
		}
		for ; m < 60; m, s = m+1, 0 {
			if c.min&(1<<m) == 0 {
				continue
			}
			if s2, ok := nextBit(c.sec, s, 59); ok {
				return h*3600 + m*60 + s2, true
			}
		}
	}
	return 0, false
}

// nextWall returns the first matching wall-clock second w' with from <= w' <
// limit. Wall seconds are the civil date-time read as if it were UTC.
func (c *cronSpec) nextWall(from, limit int64) (int64, bool) {
	day := floorDiv(from, 86400)
	tod := int(from - day*86400)
	for day*86400 < limit {
		y, mo, d := time.Unix(day*86400, 0).UTC().Date()
		if c.month&(1<<int(mo)) == 0 {
			day = time.Date(y, mo+1, 1, 0, 0, 0, 0, time.UTC).Unix() / 86400
			tod = 0
			continue
		}
		wd := time.Weekday(floorMod(day+4, 7)) // 1970-01-01 was a Thursday
		if c.dayMatches(d, wd) {
			if t, ok := c.nextTOD(tod); ok {
				w := day*86400 + int64(t)
				return w, w < limit
			}
		}
		day++
		tod = 0
	}
	return 0, false
}

// atOrAfter returns the first fire instant (Unix seconds) >= u, under the DST
// rules in doc.go. The zone's history is walked span by span (ZoneBounds):
// within a span of constant UTC offset, wall time = instant + offset.
func (c *cronSpec) atOrAfter(u int64) (int64, bool) {
	horizon := u + cronHorizonSec
	maxSec := int64(MaxTimeMs / 1000)
	for u < horizon && u <= maxSec {
		t := time.Unix(u, 0).In(c.loc)
		_, off32 := t.Zone()
		off := int64(off32)
		start, end := t.ZoneBounds()
		endSec := horizon
		if !end.IsZero() && end.Unix() < endSec {
			endSec = end.Unix()
		}
		best, found := int64(0), false
		normalFrom := u
		if !start.IsZero() {
			s := start.Unix()
			_, prev32 := time.Unix(s-1, 0).In(c.loc).Zone()
			prev := int64(prev32)
			switch {
			case prev < off: // spring forward: walls [s+prev, s+off) do not exist
				if w, ok := c.nextWall(max(s, u)+prev, s+off); ok {
					best, found = w-prev, true // read with the offset before the gap
				}
			case prev > off && !c.everyHour: // fall back: walls [s+off, s+prev) repeat
				normalFrom = max(u, s+prev-off) // they fired at their first occurrence
			}
		}
		limit := endSec
		if found {
			limit = best // a normal match must be earlier to win; equal is the same fire
		}
		if normalFrom < limit {
			if w, ok := c.nextWall(normalFrom+off, limit+off); ok {
				best, found = w-off, true
			}
		}
		if found {
			return best, best <= maxSec
		}
		u = endSec
	}
	return 0, false
}

// zones caches loaded zones, so a shard compiling many jobs reads each zone
// file once. It is bounded by the tz database: failures are not cached.
var zones sync.Map // name -> *time.Location

// loadZone loads an IANA zone ("" = UTC) via time.LoadLocation: the system's
// zoneinfo, else the copy embedded by the time/tzdata import in doc.go.
func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if len(name) > MaxTZBytes {
		return nil, invalid(FieldTZ, "%d bytes, the limit is %d", len(name), MaxTZBytes)
	}
	if strings.EqualFold(name, "local") {
		return nil, invalid(FieldTZ, "%q is not accepted (it depends on the server); name an IANA zone such as Europe/Berlin", name)
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, invalid(FieldTZ, "unknown time zone %q; name an IANA zone such as America/New_York", name)
	}
	zones.Store(name, loc)
	return loc, nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }
