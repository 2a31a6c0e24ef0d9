package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronParser accepts 5 fields, 6 with leading seconds, and descriptors (@hourly, …).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxCronSteps bounds the search for the next match (robfig's own search stops after
// five years of wall time; each step here is one such search).
const maxCronSteps = 64

// cronSpec is a parsed cron expression evaluated on the wall clock of loc.
//
// DST rules: matching is done on wall-clock time, then mapped to an instant.
//   - A wall time that does not exist (spring-forward gap) fires at the instant Go's
//     time.Date gives it, i.e. shifted forward by the gap (a daily 02:30 in New York
//     fires at 03:30 EDT on that day): a daily job never loses a day.
//   - A wall time that occurs twice (fall-back overlap) fires once, at its first
//     occurrence — unless the expression matches every hour, in which case the
//     repeated hour fires again (so `*/5 * * * *` has no hour-long hole).
type cronSpec struct {
	sched     *cron.SpecSchedule
	loc       *time.Location
	everyHour bool
}

func parseCron(expr string) (*cronSpec, error) {
	e := strings.TrimSpace(expr)
	if e == "" {
		return nil, invalid(FieldCron, "is empty")
	}
	if strings.HasPrefix(e, "TZ=") || strings.HasPrefix(e, "CRON_TZ=") {
		return nil, invalid(FieldCron, "%q: give the time zone in tz, not in the expression", expr)
	}
	if strings.HasPrefix(e, "@every") {
		return nil, invalid(FieldCron, "%q: use a fixed-rate schedule (every) instead of @every", expr)
	}
	s, err := safeParse(e)
	if err != nil {
		return nil, invalid(FieldCron, "%q: %v", expr, err)
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, invalid(FieldCron, "%q: unsupported expression", expr)
	}
	const hours24 = (1 << 24) - 1
	c := &cronSpec{sched: spec, loc: time.UTC, everyHour: spec.Hour&hours24 == hours24}
	if !c.satisfiable() {
		return nil, invalid(FieldCron, "%q never matches any date", expr)
	}
	return c, nil
}

func safeParse(expr string) (s cron.Schedule, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = invalidf("%v", p)
		}
	}()
	return cronParser.Parse(expr)
}

type strErr string

func (e strErr) Error() string { return string(e) }

func invalidf(format string, args ...any) error {
	return strErr(strings.TrimSpace(fmt.Sprintf(format, args...)))
}

// satisfiable rejects expressions such as `0 0 31 2 *` that no date matches.
func (c *cronSpec) satisfiable() bool {
	t := c.sched.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Second))
	if !t.IsZero() {
		return true
	}
	// robfig searches five years; a Feb 29 rule needs a leap year in range.
	return !c.sched.Next(time.Date(2003, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero()
}

// wall returns the wall-clock fields of instant sec in loc as a naive UTC time.
func (c *cronSpec) wall(sec int64) time.Time {
	t := time.Unix(sec, 0).In(c.loc)
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
}

// instants maps a naive wall time to the instants it fires at in loc: its first
// occurrence; its second too when the wall time repeats (fall-back) and the
// expression matches every hour; a wall time inside a spring-forward gap maps with
// the offset from before the gap, i.e. shifted forward by the gap.
func (c *cronSpec) instants(w time.Time) (first, second int64, two bool) {
	n := w.Unix()
	_, before := time.Unix(n-14*3600, 0).In(c.loc).Zone()
	_, after := time.Unix(n+14*3600, 0).In(c.loc).Zone()
	var hits []int64
	for _, off := range [2]int{before, after} {
		t := n - int64(off)
		if c.wall(t).Equal(w) && (len(hits) == 0 || hits[0] != t) {
			hits = append(hits, t)
		}
	}
	switch len(hits) {
	case 0:
		return n - int64(before), 0, false
	case 1:
		return hits[0], 0, false
	}
	a, b := min(hits[0], hits[1]), max(hits[0], hits[1])
	return a, b, c.everyHour
}

// offsets returns the smallest and largest UTC offset (seconds) of loc around sec.
func (c *cronSpec) offsets(sec int64) (lo, hi int64) {
	lo, hi = 1<<31, -(1 << 31)
	for _, t := range [3]int64{sec - 86400, sec, sec + 86400} {
		_, off := time.Unix(t, 0).In(c.loc).Zone()
		lo, hi = min(lo, int64(off)), max(hi, int64(off))
	}
	return lo, hi
}

// atOrAfter returns the first matching instant (unix seconds) >= sec. Wall-clock
// matches are visited in order from the earliest wall time that could map to an
// instant >= sec, and the search stops once no later wall time can map earlier
// than the best instant found.
func (c *cronSpec) atOrAfter(sec int64) (int64, bool) {
	offLo, offHi := c.offsets(sec)
	margin := int64(0)
	if offLo != offHi {
		margin = 3600 // near a transition, allow one more DST hour either way
	}
	w := time.Unix(sec+offLo-margin, 0).UTC().Add(-time.Second)
	best, found := int64(0), false
	for i := 0; i < maxCronSteps*64; i++ {
		m := c.sched.Next(w)
		if m.IsZero() {
			// robfig searches five years of wall time; a Feb 29 rule may need more
			// (2096 → 2104). Go on from where its search stopped.
			if w.Year() > 9000 {
				break
			}
			w = time.Date(w.Year()+5, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Second)
			continue
		}
		if found && m.Unix()-offHi-margin > best {
			break
		}
		a, b, two := c.instants(m)
		for _, t := range [2]int64{a, b} {
			if t >= sec && (!found || t < best) {
				best, found = t, true
			}
			if !two {
				break
			}
		}
		w = m
	}
	return best, found
}

// loadZone loads an IANA zone ("" = UTC).
func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if strings.EqualFold(name, "local") {
		return nil, invalid(FieldTZ, "%q: give an IANA zone such as Europe/Berlin; Local depends on the server", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, invalid(FieldTZ, "unknown time zone %q (want an IANA name such as Asia/Shanghai)", name)
	}
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
