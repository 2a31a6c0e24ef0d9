package schedule

import (
	"slices"
	"testing"
)

func TestMisfires(t *testing.T) {
	rate := Spec{Kind: FixedRate, EveryMs: 10 * min_}
	hourly := Spec{Kind: Cron, Cron: "0 * * * *"}
	tests := []struct {
		name        string
		spec        Spec
		missed, now int64
		runs        int64
		p           Misfire
		limit       int
		wantFire    []int64
		wantNext    int64
		wantOK      bool
	}{
		{"rate fire once", rate, t0, t0 + 35*min_, 5, FireOnce, 0, []int64{t0}, t0 + 40*min_, true},
		{"rate skip", rate, t0, t0 + 35*min_, 5, Skip, 0, nil, t0 + 40*min_, true},
		{"rate fire all", rate, t0, t0 + 35*min_, 5, FireAll, 0, []int64{t0, t0 + 10*min_, t0 + 20*min_, t0 + 30*min_}, t0 + 40*min_, true},
		{"rate fire all, now on a due", rate, t0, t0 + 30*min_, 5, FireAll, 0, []int64{t0, t0 + 10*min_, t0 + 20*min_, t0 + 30*min_}, t0 + 40*min_, true},
		{"rate fire all limit", rate, t0, t0 + 35*min_, 5, FireAll, 2, []int64{t0, t0 + 10*min_}, t0 + 40*min_, true},
		{"rate fire all max runs", Spec{Kind: FixedRate, EveryMs: 10 * min_, MaxRuns: 7}, t0, t0 + 35*min_, 5, FireAll, 0, []int64{t0, t0 + 10*min_}, 0, false},
		{"rate fire once last run", Spec{Kind: FixedRate, EveryMs: 10 * min_, MaxRuns: 6}, t0, t0 + 35*min_, 5, FireOnce, 0, []int64{t0}, 0, false},
		{"rate skip keeps max runs", Spec{Kind: FixedRate, EveryMs: 10 * min_, MaxRuns: 6}, t0, t0 + 35*min_, 5, Skip, 0, nil, t0 + 40*min_, true},
		{"rate already exhausted", Spec{Kind: FixedRate, EveryMs: 10 * min_, MaxRuns: 5}, t0, t0 + 35*min_, 5, FireAll, 0, nil, 0, false},
		{"rate fire all stops at not-after", Spec{Kind: FixedRate, EveryMs: 10 * min_, NotAfterMs: t0 + 15*min_}, t0, t0 + 35*min_, 0, FireAll, 0, []int64{t0, t0 + 10*min_}, 0, false},
		{"rate skip past window", Spec{Kind: FixedRate, EveryMs: 10 * min_, NotAfterMs: t0 + 15*min_}, t0, t0 + 35*min_, 0, Skip, 0, nil, 0, false},
		{"due not yet passed", rate, t0 + hour, t0, 0, FireAll, 0, nil, t0 + hour, true},

		{"cron fire once", hourly, t0, t0 + 150*min_, 0, FireOnce, 0, []int64{t0}, t0 + 3*hour, true},
		{"cron skip", hourly, t0, t0 + 150*min_, 0, Skip, 0, nil, t0 + 3*hour, true},
		{"cron fire all", hourly, t0, t0 + 150*min_, 0, FireAll, 0, []int64{t0, t0 + hour, t0 + 2*hour}, t0 + 3*hour, true},
		{"cron fire all limit over max", hourly, t0, t0 + 150*min_, 0, FireAll, 1000, []int64{t0, t0 + hour, t0 + 2*hour}, t0 + 3*hour, true},
		{"cron fire all limit", hourly, t0, t0 + 150*min_, 0, FireAll, 1, []int64{t0}, t0 + 3*hour, true},
		{"cron now on a match is missed", hourly, t0, t0 + 2*hour, 0, FireAll, 0, []int64{t0, t0 + hour, t0 + 2*hour}, t0 + 3*hour, true},

		{"delay fire once", Spec{Kind: FixedDelay, EveryMs: min_}, t0, t0 + hour, 3, FireOnce, 0, []int64{t0}, 0, false},
		{"delay fire all", Spec{Kind: FixedDelay, EveryMs: min_}, t0, t0 + hour, 3, FireAll, 0, []int64{t0}, 0, false},
		{"delay skip reschedules", Spec{Kind: FixedDelay, EveryMs: min_}, t0, t0 + hour, 3, Skip, 0, nil, t0 + hour + min_, true},

		{"once fires whatever the policy", Spec{Kind: Once, AtMs: t0}, t0, t0 + hour, 0, Skip, 0, []int64{t0}, 0, false},
		{"api only", Spec{Kind: APIOnly}, t0, t0 + hour, 0, FireAll, 0, nil, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustCompile(t, tt.spec)
			fire, next, ok := c.Misfires(tt.missed, tt.now, tt.runs, tt.p, tt.limit)
			if !slices.Equal(fire, tt.wantFire) || ok != tt.wantOK || (ok && next != tt.wantNext) {
				t.Fatalf("Misfires = %v %s %v, want %v %s %v", fire, fmtMs(next), ok, tt.wantFire, fmtMs(tt.wantNext), tt.wantOK)
			}
		})
	}
}

func TestMisfiresFireAllIsBounded(t *testing.T) {
	c := mustCompile(t, Spec{Kind: FixedRate, EveryMs: sec})
	for _, limit := range []int{0, -1, MaxMisfireFires + 1} {
		fire, next, ok := c.Misfires(t0, t0+30*day, 0, FireAll, limit)
		if len(fire) != MaxMisfireFires || fire[0] != t0 || fire[MaxMisfireFires-1] != t0+(MaxMisfireFires-1)*sec {
			t.Fatalf("limit %d: %d fires", limit, len(fire))
		}
		if !ok || next != t0+30*day+sec {
			t.Fatalf("limit %d: next %s %v", limit, fmtMs(next), ok)
		}
	}
}

func TestMisfiresCronDST(t *testing.T) {
	// Shard down over the New York fall-back night: an hourly job misses
	// 01:00 EDT, 01:00 EST and 02:00 EST.
	c := mustCompile(t, Spec{Kind: Cron, Cron: "0 * * * *", TZ: "America/New_York"})
	fire, next, ok := c.Misfires(ms(t, "2024-11-03T01:00:00-04:00"), ms(t, "2024-11-03T02:30:00-05:00"), 0, FireAll, 0)
	want := []int64{ms(t, "2024-11-03T01:00:00-04:00"), ms(t, "2024-11-03T01:00:00-05:00"), ms(t, "2024-11-03T02:00:00-05:00")}
	if !slices.Equal(fire, want) || !ok || next != ms(t, "2024-11-03T03:00:00-05:00") {
		t.Fatalf("got %v %s %v", fire, fmtMs(next), ok)
	}
}

func TestParseMisfire(t *testing.T) {
	for in, want := range map[string]Misfire{"": FireOnce, "fire_once": FireOnce, "skip": Skip, "fire_all": FireAll, " FIRE_ALL ": FireAll} {
		got, err := ParseMisfire(in)
		if err != nil || got != want {
			t.Errorf("ParseMisfire(%q) = %v, %v", in, got, err)
		}
		if in != "" && in[0] != ' ' && got.String() != in {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	for _, in := range []string{"fireall", "never", "fire-once"} {
		_, err := ParseMisfire(in)
		wantField(t, err, FieldMisfire)
	}
}
