// Package schedule computes the fire times of kjob jobs.
//
// It is pure: no goroutines, no clock, no randomness. The caller passes every
// time in, as Unix milliseconds (int64), and gets due times back. The shard core
// calls it when a job is created or updated (First), when a due fires (Next),
// when a fixed-delay run finishes (AfterFinish) and when it comes back after
// downtime (Misfires). The only I/O is loading a time zone in Compile (see
// "Time zones" below); everything a *Compiled does afterwards is arithmetic.
//
// # Kinds
//
//	Once        fires once at Spec.AtMs. A delay is converted by the caller
//	            (AtMs = created + delay). An AtMs in the past is still returned
//	            by First: the caller's wheel fires past dues at once.
//	Cron        fires at every instant the cron expression matches in Spec.TZ.
//	FixedRate   fires on a grid: StartMs, StartMs+Every, StartMs+2·Every, …
//	            Without StartMs the first fire is the creation time and the
//	            grid is anchored at each due the caller passes to Next.
//	FixedDelay  fires Every after the previous run *finished* (AfterFinish).
//	APIOnly     never fires by itself; only a trigger runs it.
//
// Every kind honours the optional lifecycle window [NotBeforeMs, NotAfterMs]
// (both inclusive, 0 = unbounded) and MaxRuns (0 = unlimited). The window
// bounds *due times*: a due inside the window that fires late, because the
// shard was down, still fires (subject to the misfire policy).
//
// # The First / Next contract
//
// First(createdMs) gives the first due of a job created or updated at
// createdMs. Next(afterMs, runsSoFar) gives the due that follows a due at
// afterMs; for Cron, Once and FixedRate with a StartMs it is simply "the first
// due strictly after afterMs", for any afterMs. Two kinds have no grid of their
// own, and Next reads afterMs as the previous event:
//
//   - FixedRate without StartMs: afterMs is the previous due, the grid is
//     anchored at it, Next returns afterMs+Every.
//   - FixedDelay: afterMs is the previous run's finish, Next returns
//     afterMs+Every (the same as AfterFinish).
//
// So Next(createdMs-1, 0) is not a way to get the first due: use First. A
// shard that keeps "the job's next due" in its journal and calls First on
// create/update, Next on every fire, AfterFinish on a fixed-delay finish and
// Misfires on recovery gets the same answers before and after a restart.
//
// # Cron
//
// Five fields (minute hour day-of-month month day-of-week, seconds = 0) or six
// (a leading seconds field), as parsed by github.com/robfig/cron/v3: ranges,
// lists, steps, month and weekday names, "?" for "*". Day-of-month and
// day-of-week combine as in Vixie cron: if either is "*" both must match,
// otherwise either may. The descriptors @yearly (@annually), @monthly,
// @weekly, @daily (@midnight) and @hourly are accepted. "@every <duration>" is
// refused: it is an interval, not a calendar rule, and kjob has FixedRate for
// it. A "TZ=" / "CRON_TZ=" prefix is refused too: the zone is Spec.TZ.
// Expressions that can never match a date ("0 0 30 2 *") are refused. Cron
// fires on whole seconds; "strictly after 10:00:00.250" is 10:00:01 at the
// earliest.
//
// The fire times are computed here, on robfig's parsed bit sets, not by
// robfig's own Next, which walks absolute time and so fires a 01:30 job twice
// on a fall-back day and silently drops a 02:30 job on a spring-forward day.
//
// # Daylight saving time
//
// A cron expression matches wall-clock times in its zone. Each matching wall
// time becomes one instant, by these rules:
//
//   - A wall time that exists once is that instant.
//   - A wall time that does not exist (the spring-forward gap) is read with
//     the offset in force before the gap, i.e. moved forward by the gap's
//     length: a daily "30 2 * * *" in America/New_York fires at 03:30 EDT on
//     2024-03-10 (and in Europe/Berlin at 03:30 CEST on 2024-03-31). This is
//     java.time's resolution; a daily job never loses a day. Where a moved
//     gap time lands on an instant that fires anyway (an hourly job's 02:00
//     becomes 03:00 EDT), it fires once.
//   - A wall time that exists twice (the fall-back overlap) fires at its first
//     occurrence only: "30 1 * * *" in America/New_York fires at 01:30 EDT on
//     2024-11-03, not again at 01:30 EST. The exception is an expression that
//     matches every hour (its hour field is "*" or covers 0-23): it keeps
//     firing through the repeated hour as real time passes, so "*/5 * * * *"
//     has no hour-long hole and "@hourly" fires at 01:00 EDT and 01:00 EST.
//
// The same rules hold for zones whose shift is not an hour (Australia/
// Lord_Howe moves by 30 minutes).
//
// # Time zones
//
// Spec.TZ is an IANA name ("" = UTC); "Local" is refused, since it would make
// a job's fire times depend on the machine. Zones are loaded with
// time.LoadLocation: the system's zoneinfo first, then the copy of the tz
// database embedded in the binary by the time/tzdata import below, so a server
// in a container without /usr/share/zoneinfo still accepts zoned jobs. (Go's
// documentation prefers that import in a main package; it lives here because
// this package is what needs it and kjob has a single binary.) Loading a zone
// costs a file read and a parse, so a shard compiling many jobs should keep a
// Compiler, which loads each zone once.
//
// # Misfires
//
// After downtime, Misfires turns "the due I had scheduled was lastDueMs and now
// it is nowMs" into the dues to fire now and the next future due, per the
// job's Misfire policy: FireOnce (default) fires the most recent missed due,
// Skip fires none, FireAll fires the missed dues up to a limit (at most
// MaxMisfireFires), keeping the most recent ones. A Once job is not periodic:
// its due fires whatever the policy.
//
// # Limits
//
// Every input is bounded and every bound is a named constant: MinEveryMs,
// MaxEveryMs, MaxTimeMs, MaxCronBytes, MaxTZBytes, MaxMisfireFires,
// MaxLadderLevels, MaxLadderDelayMs, MaxLadderBytes. Bad input is refused with
// an *Error that names the field (Field* constants) and the limit, and matches
// ErrInvalid under errors.Is.
package schedule

import (
	// Embedded tz database, used when the system has none; see "Time zones".
	_ "time/tzdata"
)
