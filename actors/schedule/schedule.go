package schedule

import "fmt"

// Kind is the type of a schedule.
type Kind int

// Schedule kinds.
const (
	Once Kind = iota + 1
	Cron
	FixedRate
	FixedDelay
	APIOnly
)

func (k Kind) String() string {
	switch k {
	case Once:
		return "once"
	case Cron:
		return "cron"
	case FixedRate:
		return "fixed_rate"
	case FixedDelay:
		return "fixed_delay"
	case APIOnly:
		return "api_only"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Input limits. Times are Unix milliseconds.
const (
	MinEveryMs = 1
	MaxEveryMs = 366 * 24 * 3600 * 1000 // 366 days
	MaxTimeMs  = 253402300799999        // 9999-12-31T23:59:59.999Z
)

// Spec is a job's schedule as the user gave it. See doc.go for the meaning of
// every field per kind.
type Spec struct {
	Kind    Kind
	AtMs    int64  // Once: absolute due (a delay is converted by the caller)
	Cron    string // 5-field, 6-field (leading seconds), or a descriptor
	TZ      string // IANA zone, "" = UTC
	EveryMs int64  // FixedRate / FixedDelay interval
	StartMs int64  // optional first fire for FixedRate / FixedDelay (0 = created + every)

	NotBeforeMs, NotAfterMs int64 // optional lifecycle window, inclusive, 0 = unbounded
	MaxRuns                 int64 // 0 = unlimited
}

// Compiled is a validated Spec, ready to compute fire times. It is immutable
// and safe for concurrent use.
type Compiled struct {
	spec Spec
	cron *cronSpec
}

// Compile validates s. Errors are *Error naming the field at fault and match
// ErrInvalid.
func Compile(s Spec) (*Compiled, error) {
	c := &Compiled{spec: s}
	if s.NotBeforeMs < 0 || s.NotBeforeMs > MaxTimeMs {
		return nil, invalid(FieldNotBefore, "%d is outside 0..%d (Unix ms)", s.NotBeforeMs, int64(MaxTimeMs))
	}
	if s.NotAfterMs < 0 || s.NotAfterMs > MaxTimeMs {
		return nil, invalid(FieldNotAfter, "%d is outside 0..%d (Unix ms)", s.NotAfterMs, int64(MaxTimeMs))
	}
	if s.NotAfterMs != 0 && s.NotAfterMs < s.NotBeforeMs {
		return nil, invalid(FieldNotAfter, "the window ends (%d) before it starts (not_before %d)", s.NotAfterMs, s.NotBeforeMs)
	}
	if s.MaxRuns < 0 {
		return nil, invalid(FieldMaxRuns, "%d is negative (0 = unlimited)", s.MaxRuns)
	}
	// A zone is validated for every kind, so a bad one is never stored.
	loc, err := loadZone(s.TZ)
	if err != nil {
		return nil, err
	}
	usesAt, usesCron, usesEvery := false, false, false
	switch s.Kind {
	case Once:
		usesAt = true
		if s.AtMs <= 0 || s.AtMs > MaxTimeMs {
			return nil, invalid(FieldAt, "%d is outside 1..%d (Unix ms)", s.AtMs, int64(MaxTimeMs))
		}
		if s.AtMs < s.NotBeforeMs || (s.NotAfterMs != 0 && s.AtMs > s.NotAfterMs) {
			return nil, invalid(FieldAt, "%d is outside the window [not_before %d, not_after %d], so it could never fire", s.AtMs, s.NotBeforeMs, s.NotAfterMs)
		}
	case Cron:
		usesCron = true
		cs, err := parseCron(s.Cron)
		if err != nil {
			return nil, err
		}
		cs.loc = loc
		c.cron = cs
	case FixedRate, FixedDelay:
		usesEvery = true
		if s.EveryMs < MinEveryMs || s.EveryMs > MaxEveryMs {
			return nil, invalid(FieldEvery, "%d ms is outside %d ms..%d ms (366 days)", s.EveryMs, MinEveryMs, MaxEveryMs)
		}
		if s.StartMs < 0 || s.StartMs > MaxTimeMs {
			return nil, invalid(FieldStart, "%d is outside 0..%d (Unix ms)", s.StartMs, int64(MaxTimeMs))
		}
		if s.StartMs != 0 && s.NotAfterMs != 0 && s.StartMs > s.NotAfterMs {
			return nil, invalid(FieldStart, "%d is after not_after %d, so it could never fire", s.StartMs, s.NotAfterMs)
		}
	case APIOnly:
	default:
		return nil, invalid(FieldKind, "unknown kind %d (want once, cron, fixed_rate, fixed_delay or api_only)", int(s.Kind))
	}
	if !usesAt && s.AtMs != 0 {
		return nil, invalid(FieldAt, "only a kind once job has a time; this is %v", s.Kind)
	}
	if !usesCron && s.Cron != "" {
		return nil, invalid(FieldCron, "only a kind cron job has an expression; this is %v", s.Kind)
	}
	if !usesEvery && s.EveryMs != 0 {
		return nil, invalid(FieldEvery, "only fixed_rate and fixed_delay jobs have an interval; this is %v", s.Kind)
	}
	if !usesEvery && s.StartMs != 0 {
		return nil, invalid(FieldStart, "only fixed_rate and fixed_delay jobs have a start; this is %v", s.Kind)
	}
	return c, nil
}

// Spec returns the spec c was compiled from.
func (c *Compiled) Spec() Spec { return c.spec }

// Periodic reports whether the job fires repeatedly by itself (Cron,
// FixedRate, FixedDelay); misfire policies apply only to these.
func (c *Compiled) Periodic() bool {
	switch c.spec.Kind {
	case Cron, FixedRate, FixedDelay:
		return true
	}
	return false
}

func (c *Compiled) exhausted(runsSoFar int64) bool {
	return c.spec.MaxRuns > 0 && runsSoFar >= c.spec.MaxRuns
}

// tooLate reports whether due is past the window (or the time limit).
func (c *Compiled) tooLate(due int64) bool {
	return due > MaxTimeMs || (c.spec.NotAfterMs != 0 && due > c.spec.NotAfterMs)
}

// First is the first due of a job created, updated or resumed at nowMs that
// has already run runsSoFar times. ok is false when it never fires by itself.
func (c *Compiled) First(nowMs, runsSoFar int64) (dueMs int64, ok bool) {
	if c.exhausted(runsSoFar) {
		return 0, false
	}
	nowMs = clampTime(nowMs)
	s := c.spec
	switch s.Kind {
	case Once:
		return s.AtMs, true // may be in the past: the wheel fires it at once
	case Cron:
		return c.cronAtOrAfter(max(nowMs, s.NotBeforeMs))
	case FixedRate:
		due := nowMs + s.EveryMs
		if s.StartMs != 0 {
			due = s.StartMs
			if due < nowMs {
				due += ceilDiv(nowMs-due, s.EveryMs) * s.EveryMs
			}
		}
		return c.rateWindow(due)
	case FixedDelay:
		due := nowMs + s.EveryMs
		if s.StartMs != 0 && runsSoFar == 0 { // the start is the first run's; later ones follow finishes
			due = s.StartMs
		}
		return c.delayWindow(due)
	}
	return 0, false
}

// Next is the due after a fire that was due at dueMs; runsSoFar counts that
// fire. Once, FixedDelay (see AfterFinish) and APIOnly have none.
func (c *Compiled) Next(dueMs, runsSoFar int64) (int64, bool) {
	if c.exhausted(runsSoFar) {
		return 0, false
	}
	switch c.spec.Kind {
	case Cron:
		return c.cronAtOrAfter(max(clampTime(dueMs)+1, c.spec.NotBeforeMs))
	case FixedRate:
		return c.rateWindow(clampTime(dueMs) + c.spec.EveryMs)
	}
	return 0, false
}

// AfterFinish is, for FixedDelay, the due after a run that finished at
// finishedMs (runsSoFar counts that run): finishedMs+Every, moved up to
// NotBefore, none past NotAfter or MaxRuns. Other kinds have none.
func (c *Compiled) AfterFinish(finishedMs, runsSoFar int64) (int64, bool) {
	if c.spec.Kind != FixedDelay || c.exhausted(runsSoFar) {
		return 0, false
	}
	return c.delayWindow(clampTime(finishedMs) + c.spec.EveryMs)
}

// cronAtOrAfter is the first cron match at or after ms, within the window.
func (c *Compiled) cronAtOrAfter(ms int64) (int64, bool) {
	sec, ok := c.cron.atOrAfter(ceilDiv(ms, 1000))
	if !ok || c.tooLate(sec*1000) {
		return 0, false
	}
	return sec * 1000, true
}

// rateWindow moves a grid point up to the first grid point >= NotBefore.
func (c *Compiled) rateWindow(due int64) (int64, bool) {
	if nb := c.spec.NotBeforeMs; due < nb {
		due += ceilDiv(nb-due, c.spec.EveryMs) * c.spec.EveryMs
	}
	if c.tooLate(due) {
		return 0, false
	}
	return due, true
}

// delayWindow moves a fixed-delay due up to NotBefore.
func (c *Compiled) delayWindow(due int64) (int64, bool) {
	due = max(due, c.spec.NotBeforeMs)
	if c.tooLate(due) {
		return 0, false
	}
	return due, true
}

// clampTime keeps caller times in 0..MaxTimeMs+1, so arithmetic on them
// cannot overflow; MaxTimeMs+1 is past every valid due.
func clampTime(ms int64) int64 {
	return min(max(ms, 0), MaxTimeMs+1)
}
