// Package schedule computes the fire times of kjob jobs.
//
// It is pure: no goroutines, no clock, no randomness, no I/O after Compile.
// The caller passes every time in as Unix milliseconds (int64) and gets due
// times back. The shard calls Compile on create/update, First when a job is
// created, updated or resumed, Next when a due fires, AfterFinish when a
// fixed-delay run finishes and Misfires when it comes back after downtime.
// A *Compiled is immutable and safe for concurrent use.
//
// # Kinds
//
//	Once        fires once at Spec.AtMs (a delay is converted by the caller).
//	            First returns AtMs even when it is in the past: the wheel
//	            fires past dues at once.
//	Cron        fires at every instant the expression matches in Spec.TZ.
//	FixedRate   fires on a grid of Spec.EveryMs. With StartMs the grid is
//	            StartMs + k·Every and First is its first point >= now; without
//	            it First is now + Every. Next(due) is due + Every.
//	FixedDelay  First is StartMs, else now + Every; after that every fire is
//	            AfterFinish(finished) = finished + Every. Next is none.
//	APIOnly     never fires by itself; only a trigger runs it.
//
// Every kind honours the lifecycle window [NotBeforeMs, NotAfterMs] (inclusive,
// 0 = unbounded) and MaxRuns (0 = unlimited). A due before NotBefore moves to
// the kind's first due >= NotBefore (the next grid point for FixedRate, the
// next match for Cron, NotBefore itself for FixedDelay); a due past NotAfter
// is none; runsSoFar >= MaxRuns is none. A Once whose AtMs is outside the
// window could never fire and is refused by Compile.
//
// # Cron
//
// Five fields (minute hour day-of-month month day-of-week; seconds = 0) or six
// (leading seconds), parsed by github.com/robfig/cron/v3: ranges, lists,
// steps, month and weekday names, "?" for "*". Day-of-month and day-of-week
// combine as in Vixie cron: if either is "*" both must match, otherwise
// either may. Descriptors: @yearly (@annually), @monthly, @weekly, @daily
// (@midnight), @hourly. Refused: "@every" (use FixedRate), a "TZ=" /
// "CRON_TZ=" prefix (use Spec.TZ), and expressions no date matches
// ("0 0 30 2 *"). Fires are whole seconds: First(now) is the first match >=
// now rounded up to a second, Next(due) the first match > due. "0 0 29 2 *"
// works across 2100 (2096-02-29 → 2104-02-29).
//
// Only robfig's parser is used. Its SpecSchedule.Next is not: checked on
// v3.0.1, it skips a daily 02:30 on a spring-forward day, fires a daily 01:30
// twice on a fall-back day (America/New_York and Europe/Berlin alike), and
// finds no Feb 29 after 2097 (its search stops after five years). This package
// evaluates robfig's bit sets itself, span by span of constant UTC offset.
//
// # Daylight saving time
//
// An expression matches wall-clock times in its zone. Each matching wall time
// becomes at most one instant:
//
//   - A wall time that exists once is that instant.
//   - A wall time that does not exist (the spring-forward gap) is read with
//     the offset before the gap, i.e. moved forward by the gap's length: a
//     daily "30 2 * * *" fires at 03:30 EDT on 2024-03-10 in America/New_York
//     and at 03:30 CEST on 2024-03-31 in Europe/Berlin. A daily job never loses
//     a day. When a moved time lands on an instant that fires anyway (hourly
//     02:00 becomes 03:00 EDT; "0 2,3 * * *"), it fires once.
//   - A wall time that exists twice (the fall-back overlap) fires at its first
//     occurrence only: "30 1 * * *" fires at 01:30 EDT on 2024-11-03, not again
//     at 01:30 EST. The exception is an expression whose hour field covers all
//     of 0-23 ("*/5 * * * *", "@hourly"): it keeps firing through the repeated
//     hour in real time, so it has no hour-long hole, and "@hourly" fires at
//     01:00 EDT and at 01:00 EST. A job created during the repeated hour for a
//     time already fired in its first occurrence waits for the next day.
//
// The rules do not assume a one-hour shift (Australia/Lord_Howe moves 30 min).
//
// # Time zones
//
// Spec.TZ is an IANA name ("" or "UTC" = UTC); "Local" is refused, since it
// would make fire times depend on the machine. The zone is validated for every
// kind, so a bad one is never stored. Compile loads zones with
// time.LoadLocation (the system's zoneinfo, else the tz database embedded by
// the time/tzdata import below, so a container without /usr/share/zoneinfo
// still works) and caches each zone once per process.
//
// # Misfires
//
// After downtime, Misfires(missed, now, …) turns "the due I had was missed and
// now it is now" into the dues to fire now (oldest first) and the next due >
// now: FireOnce (default) fires [missed]; Skip fires none; FireAll fires every
// missed due <= now, the oldest first, at most the limit (<= 0 or over
// MaxMisfireFires means MaxMisfireFires) — dues past the limit are dropped.
// Once fires its due whatever the policy; FixedDelay has one pending due
// (Skip reschedules it at now + Every); see Misfires for the details.
//
// # Bad input
//
// Every input is bounded and every bound is a named constant: MinEveryMs,
// MaxEveryMs (366 days), MaxTimeMs (year 9999), MaxCronBytes, MaxTZBytes,
// MaxMisfireFires, MaxLadderLevels, MaxLadderDelayMs (7 days),
// MaxLadderBytes. Bad input is an *Error whose Field is one of the Field*
// constants ("kind", "at", "cron", "tz", "every", "start", "not_before",
// "not_after", "max_runs", "misfire", "ladder"), whose text reads
// "schedule.<field>: <reason and limit>", and which matches ErrInvalid under
// errors.Is. A field set on a kind that does not use it (a cron expression on
// a fixed-rate job) is refused, naming that field.
package schedule

import (
	// Embedded tz database, used when the system has none; see "Time zones".
	_ "time/tzdata"
)
