package schedule

import (
	"testing"
)

const (
	sec  = int64(1000)
	min_ = 60 * sec
	hour = 60 * min_
	day  = 24 * hour
)

// t0 is a fixed "now": 2024-05-01T12:00:00Z.
const t0 = int64(1714564800000)

type call int

const (
	callFirst call = iota
	callNext
	callAfterFinish
)

func (c call) String() string { return [...]string{"First", "Next", "AfterFinish"}[c] }

func TestKinds(t *testing.T) {
	tests := []struct {
		name   string
		spec   Spec
		call   call
		at     int64 // nowMs / dueMs / finishedMs
		runs   int64
		want   int64
		wantOK bool
	}{
		// Once.
		{"once future", Spec{Kind: Once, AtMs: t0 + hour}, callFirst, t0, 0, t0 + hour, true},
		{"once past still fires", Spec{Kind: Once, AtMs: t0 - day}, callFirst, t0, 0, t0 - day, true},
		{"once has no next", Spec{Kind: Once, AtMs: t0}, callNext, t0, 1, 0, false},
		{"once has no after-finish", Spec{Kind: Once, AtMs: t0}, callAfterFinish, t0, 1, 0, false},
		{"once already ran max", Spec{Kind: Once, AtMs: t0, MaxRuns: 1}, callFirst, t0, 1, 0, false},
		{"once inside window", Spec{Kind: Once, AtMs: t0, NotBeforeMs: t0 - 1, NotAfterMs: t0}, callFirst, t0 - day, 0, t0, true},

		// FixedRate.
		{"rate no start", Spec{Kind: FixedRate, EveryMs: min_}, callFirst, t0, 0, t0 + min_, true},
		{"rate start in future", Spec{Kind: FixedRate, EveryMs: min_, StartMs: t0 + hour}, callFirst, t0, 0, t0 + hour, true},
		{"rate start now", Spec{Kind: FixedRate, EveryMs: min_, StartMs: t0}, callFirst, t0, 0, t0, true},
		{"rate start in past snaps to grid", Spec{Kind: FixedRate, EveryMs: 10 * min_, StartMs: t0 - 25*min_}, callFirst, t0, 0, t0 + 5*min_, true},
		{"rate start in past on grid", Spec{Kind: FixedRate, EveryMs: 10 * min_, StartMs: t0 - 30*min_}, callFirst, t0, 0, t0, true},
		{"rate next", Spec{Kind: FixedRate, EveryMs: min_}, callNext, t0, 1, t0 + min_, true},
		{"rate no after-finish", Spec{Kind: FixedRate, EveryMs: min_}, callAfterFinish, t0, 1, 0, false},
		{"rate not-before moves on grid", Spec{Kind: FixedRate, EveryMs: 10 * min_, StartMs: t0, NotBeforeMs: t0 + 25*min_}, callFirst, t0, 0, t0 + 30*min_, true},
		{"rate not-before without start", Spec{Kind: FixedRate, EveryMs: 10 * min_, NotBeforeMs: t0 + 25*min_}, callFirst, t0, 0, t0 + 30*min_, true},
		{"rate not-after inclusive", Spec{Kind: FixedRate, EveryMs: min_, NotAfterMs: t0 + min_}, callNext, t0, 1, t0 + min_, true},
		{"rate past not-after", Spec{Kind: FixedRate, EveryMs: min_, NotAfterMs: t0 + min_ - 1}, callNext, t0, 1, 0, false},
		{"rate created after window", Spec{Kind: FixedRate, EveryMs: min_, NotAfterMs: t0 - 1}, callFirst, t0, 0, 0, false},
		{"rate max runs left", Spec{Kind: FixedRate, EveryMs: min_, MaxRuns: 3}, callNext, t0, 2, t0 + min_, true},
		{"rate max runs reached", Spec{Kind: FixedRate, EveryMs: min_, MaxRuns: 3}, callNext, t0, 3, 0, false},
		{"rate max runs at first", Spec{Kind: FixedRate, EveryMs: min_, MaxRuns: 3}, callFirst, t0, 3, 0, false},
		{"rate max interval", Spec{Kind: FixedRate, EveryMs: MaxEveryMs}, callFirst, t0, 0, t0 + MaxEveryMs, true},
		{"rate past the end of time", Spec{Kind: FixedRate, EveryMs: min_}, callNext, MaxTimeMs, 1, 0, false},

		// FixedDelay.
		{"delay no start", Spec{Kind: FixedDelay, EveryMs: 5 * min_}, callFirst, t0, 0, t0 + 5*min_, true},
		{"delay start", Spec{Kind: FixedDelay, EveryMs: 5 * min_, StartMs: t0 - hour}, callFirst, t0, 0, t0 - hour, true},
		{"delay has no next", Spec{Kind: FixedDelay, EveryMs: 5 * min_}, callNext, t0, 1, 0, false},
		{"delay after finish", Spec{Kind: FixedDelay, EveryMs: 5 * min_}, callAfterFinish, t0 + 17*sec, 1, t0 + 17*sec + 5*min_, true},
		{"delay not-before", Spec{Kind: FixedDelay, EveryMs: 5 * min_, NotBeforeMs: t0 + hour}, callFirst, t0, 0, t0 + hour, true},
		{"delay after finish past window", Spec{Kind: FixedDelay, EveryMs: 5 * min_, NotAfterMs: t0 + min_}, callAfterFinish, t0, 1, 0, false},
		{"delay after finish max runs", Spec{Kind: FixedDelay, EveryMs: 5 * min_, MaxRuns: 1}, callAfterFinish, t0, 1, 0, false},

		// Cron (zones and DST are in cron_test.go).
		{"cron first", Spec{Kind: Cron, Cron: "0 * * * *"}, callFirst, t0 + 1, 0, t0 + hour, true},
		{"cron first at a match", Spec{Kind: Cron, Cron: "0 * * * *"}, callFirst, t0, 0, t0, true},
		{"cron next is strictly after", Spec{Kind: Cron, Cron: "0 * * * *"}, callNext, t0, 1, t0 + hour, true},
		{"cron not-before", Spec{Kind: Cron, Cron: "0 * * * *", NotBeforeMs: t0 + 90*min_}, callFirst, t0, 0, t0 + 2*hour, true},
		{"cron not-after", Spec{Kind: Cron, Cron: "0 * * * *", NotAfterMs: t0 + 59*min_}, callNext, t0, 1, 0, false},
		{"cron max runs", Spec{Kind: Cron, Cron: "0 * * * *", MaxRuns: 2}, callNext, t0, 2, 0, false},
		{"cron no after-finish", Spec{Kind: Cron, Cron: "0 * * * *"}, callAfterFinish, t0, 1, 0, false},

		// APIOnly.
		{"api first", Spec{Kind: APIOnly}, callFirst, t0, 0, 0, false},
		{"api next", Spec{Kind: APIOnly}, callNext, t0, 1, 0, false},
		{"api after finish", Spec{Kind: APIOnly}, callAfterFinish, t0, 1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustCompile(t, tt.spec)
			var got int64
			var ok bool
			switch tt.call {
			case callFirst:
				got, ok = c.First(tt.at, tt.runs)
			case callNext:
				got, ok = c.Next(tt.at, tt.runs)
			case callAfterFinish:
				got, ok = c.AfterFinish(tt.at, tt.runs)
			}
			if ok != tt.wantOK || (ok && got != tt.want) {
				t.Fatalf("%v(%s, %d) = %s %v, want %s %v", tt.call, fmtMs(tt.at), tt.runs, fmtMs(got), ok, fmtMs(tt.want), tt.wantOK)
			}
		})
	}
}

func TestPeriodic(t *testing.T) {
	for _, tt := range []struct {
		spec Spec
		want bool
	}{
		{Spec{Kind: Once, AtMs: t0}, false},
		{Spec{Kind: Cron, Cron: "@daily"}, true},
		{Spec{Kind: FixedRate, EveryMs: sec}, true},
		{Spec{Kind: FixedDelay, EveryMs: sec}, true},
		{Spec{Kind: APIOnly}, false},
	} {
		if got := mustCompile(t, tt.spec).Periodic(); got != tt.want {
			t.Errorf("%v: Periodic() = %v", tt.spec.Kind, got)
		}
	}
}

func TestCompileBadInput(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		field string
	}{
		{"no kind", Spec{}, FieldKind},
		{"unknown kind", Spec{Kind: 9}, FieldKind},
		{"cron empty", Spec{Kind: Cron}, FieldCron},
		{"cron unparseable", Spec{Kind: Cron, Cron: "every day at noon"}, FieldCron},
		{"cron too few fields", Spec{Kind: Cron, Cron: "* * *"}, FieldCron},
		{"cron too many fields", Spec{Kind: Cron, Cron: "0 0 0 * * * *"}, FieldCron},
		{"cron out of range", Spec{Kind: Cron, Cron: "61 * * * *"}, FieldCron},
		{"cron zero step", Spec{Kind: Cron, Cron: "*/0 * * * *"}, FieldCron},
		{"cron unknown descriptor", Spec{Kind: Cron, Cron: "@fortnightly"}, FieldCron},
		{"cron @every", Spec{Kind: Cron, Cron: "@every 5m"}, FieldCron},
		{"cron tz prefix", Spec{Kind: Cron, Cron: "CRON_TZ=Europe/Berlin 0 0 * * *"}, FieldCron},
		{"cron never matches", Spec{Kind: Cron, Cron: "0 0 30 2 *"}, FieldCron},
		{"cron april 31", Spec{Kind: Cron, Cron: "0 0 31 4 *"}, FieldCron},
		{"cron too long", Spec{Kind: Cron, Cron: "0 0 * * " + string(make([]byte, MaxCronBytes))}, FieldCron},
		{"cron on a rate job", Spec{Kind: FixedRate, EveryMs: sec, Cron: "@daily"}, FieldCron},
		{"tz unknown", Spec{Kind: Cron, Cron: "@daily", TZ: "Mars/Olympus_Mons"}, FieldTZ},
		{"tz local", Spec{Kind: Cron, Cron: "@daily", TZ: "Local"}, FieldTZ},
		{"tz too long", Spec{Kind: Cron, Cron: "@daily", TZ: string(make([]byte, MaxTZBytes+1))}, FieldTZ},
		{"tz unknown on a rate job", Spec{Kind: FixedRate, EveryMs: sec, TZ: "Nowhere/City"}, FieldTZ},
		{"every zero rate", Spec{Kind: FixedRate}, FieldEvery},
		{"every negative delay", Spec{Kind: FixedDelay, EveryMs: -1}, FieldEvery},
		{"every over 366 days", Spec{Kind: FixedRate, EveryMs: MaxEveryMs + 1}, FieldEvery},
		{"every on a cron job", Spec{Kind: Cron, Cron: "@daily", EveryMs: sec}, FieldEvery},
		{"at zero", Spec{Kind: Once}, FieldAt},
		{"at negative", Spec{Kind: Once, AtMs: -5}, FieldAt},
		{"at past the end of time", Spec{Kind: Once, AtMs: MaxTimeMs + 1}, FieldAt},
		{"at before window", Spec{Kind: Once, AtMs: t0, NotBeforeMs: t0 + 1}, FieldAt},
		{"at after window", Spec{Kind: Once, AtMs: t0, NotAfterMs: t0 - 1}, FieldAt},
		{"at on a rate job", Spec{Kind: FixedRate, EveryMs: sec, AtMs: t0}, FieldAt},
		{"start negative", Spec{Kind: FixedRate, EveryMs: sec, StartMs: -1}, FieldStart},
		{"start after window", Spec{Kind: FixedDelay, EveryMs: sec, StartMs: t0 + 1, NotAfterMs: t0}, FieldStart},
		{"start on a cron job", Spec{Kind: Cron, Cron: "@daily", StartMs: t0}, FieldStart},
		{"window ends before it starts", Spec{Kind: APIOnly, NotBeforeMs: t0, NotAfterMs: t0 - 1}, FieldNotAfter},
		{"not after negative", Spec{Kind: APIOnly, NotAfterMs: -1}, FieldNotAfter},
		{"not before negative", Spec{Kind: APIOnly, NotBeforeMs: -1}, FieldNotBefore},
		{"max runs negative", Spec{Kind: FixedRate, EveryMs: sec, MaxRuns: -1}, FieldMaxRuns},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Compile(tt.spec)
			if c != nil {
				t.Fatalf("Compile returned a schedule with error %v", err)
			}
			wantField(t, err, tt.field)
		})
	}
}

func TestCompileGoodEdges(t *testing.T) {
	for _, s := range []Spec{
		{Kind: Once, AtMs: MaxTimeMs},
		{Kind: FixedRate, EveryMs: 1},
		{Kind: FixedRate, EveryMs: MaxEveryMs},
		{Kind: APIOnly, NotBeforeMs: t0, NotAfterMs: t0}, // a one-instant window
		{Kind: Cron, Cron: " 0 0 29 2 * "},
		{Kind: Cron, Cron: "0 0 31 * *"},
		{Kind: Cron, Cron: "0 0 30 2 MON"}, // day-of-month OR Monday
		{Kind: Cron, Cron: "@daily", TZ: "UTC"},
		{Kind: Cron, Cron: "@daily", TZ: "Asia/Kolkata"},
	} {
		if _, err := Compile(s); err != nil {
			t.Errorf("Compile(%+v): %v", s, err)
		}
	}
}

func TestKindString(t *testing.T) {
	if Cron.String() != "cron" || FixedDelay.String() != "fixed_delay" || Kind(0).String() != "Kind(0)" {
		t.Fatal(Cron.String(), FixedDelay.String(), Kind(0).String())
	}
}
