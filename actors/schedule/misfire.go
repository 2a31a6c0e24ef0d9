package schedule

import (
	"fmt"
	"strings"
)

// Misfire is the policy for dues that passed while the job's shard was down.
type Misfire int

// Misfire policies.
const (
	FireOnce Misfire = iota // fire once now for the missed dues, then resume
	Skip                    // fire none of them, resume at the next future due
	FireAll                 // fire every missed due (at most MaxMisfireFires), then resume
)

// MaxMisfireFires bounds the dues FireAll fires at once.
const MaxMisfireFires = 100

func (p Misfire) String() string {
	switch p {
	case FireOnce:
		return "fire_once"
	case Skip:
		return "skip"
	case FireAll:
		return "fire_all"
	}
	return fmt.Sprintf("Misfire(%d)", int(p))
}

// ParseMisfire parses "fire_once", "skip" or "fire_all" ("" = fire_once;
// case and surrounding spaces are ignored). Errors name FieldMisfire.
func ParseMisfire(s string) (Misfire, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "fire_once":
		return FireOnce, nil
	case "skip":
		return Skip, nil
	case "fire_all":
		return FireAll, nil
	}
	return FireOnce, invalid(FieldMisfire, "unknown policy %q (want fire_once, skip or fire_all)", s)
}

// Misfires handles a job whose next due, missedDueMs, is <= nowMs because its
// shard was down; runsSoFar counts the runs before it. It returns the dues to
// fire now, oldest first, and the job's next due > nowMs (ok false: none).
//
//   - FireOnce: fire = [missedDueMs].
//   - Skip: fire = none.
//   - FireAll: every missed due <= nowMs, oldest first, at most limit (<= 0 or
//     over MaxMisfireFires means MaxMisfireFires); dues past the limit are
//     dropped.
//
// The window and MaxRuns apply: no due past NotAfter fires, fire never takes
// the job past MaxRuns, and next is none once fire uses the last run.
//
// Kinds without a series: Once fires its due whatever the policy (it is not
// periodic) and has no next. FixedDelay has one pending due: FireOnce and
// FireAll fire it and leave next to AfterFinish (ok false); Skip fires nothing
// and reschedules at nowMs+Every, as if a run had just finished. APIOnly has
// nothing to fire. A missedDueMs > nowMs is no misfire: nothing fires and next
// is missedDueMs.
func (c *Compiled) Misfires(missedDueMs, nowMs, runsSoFar int64, p Misfire, limit int) (fire []int64, next int64, ok bool) {
	s := c.spec
	if s.Kind == APIOnly || c.exhausted(runsSoFar) {
		return nil, 0, false
	}
	missedDueMs, nowMs = clampTime(missedDueMs), clampTime(nowMs)
	if missedDueMs > nowMs {
		return nil, missedDueMs, true
	}
	left := int64(-1) // runs left; -1 = unlimited
	if s.MaxRuns > 0 {
		left = s.MaxRuns - runsSoFar
	}
	switch s.Kind {
	case Once:
		return []int64{missedDueMs}, 0, false
	case FixedDelay:
		if p == Skip {
			next, ok = c.delayWindow(nowMs + s.EveryMs)
			return nil, next, ok
		}
		if c.tooLate(missedDueMs) {
			return nil, 0, false
		}
		return []int64{missedDueMs}, 0, false
	}

	// Cron and FixedRate: a series of dues.
	if limit <= 0 || limit > MaxMisfireFires {
		limit = MaxMisfireFires
	}
	switch p {
	case FireOnce:
		if !c.tooLate(missedDueMs) {
			fire = []int64{missedDueMs}
		}
	case FireAll:
		for d, dok := missedDueMs, !c.tooLate(missedDueMs); dok && d <= nowMs && len(fire) < limit; {
			if left >= 0 && int64(len(fire)) >= left {
				break
			}
			fire = append(fire, d)
			d, dok = c.nextDue(d)
		}
	}
	if left >= 0 && int64(len(fire)) >= left {
		return fire, 0, false
	}
	next, ok = c.afterNow(missedDueMs, nowMs)
	return fire, next, ok
}

// nextDue is Next without MaxRuns.
func (c *Compiled) nextDue(due int64) (int64, bool) {
	if c.spec.Kind == FixedRate {
		return c.rateWindow(due + c.spec.EveryMs)
	}
	return c.cronAtOrAfter(max(due+1, c.spec.NotBeforeMs))
}

// afterNow is the first due of the series through missedDueMs that is > nowMs.
func (c *Compiled) afterNow(missedDueMs, nowMs int64) (int64, bool) {
	if c.spec.Kind == FixedRate {
		e := c.spec.EveryMs
		return c.rateWindow(missedDueMs + (floorDiv(nowMs-missedDueMs, e)+1)*e)
	}
	return c.cronAtOrAfter(max(nowMs+1, c.spec.NotBeforeMs))
}
