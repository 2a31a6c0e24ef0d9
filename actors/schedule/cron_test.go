package schedule

import (
	"math/rand"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// TestCronSequences checks First and then successive Next calls against
// expected instants, across DST in two zones, leap days, seconds and
// descriptors.
func TestCronSequences(t *testing.T) {
	tests := []struct {
		name, cron, tz, now string
		want                []string
	}{
		// America/New_York: spring forward 2024-03-10 02:00 EST -> 03:00 EDT,
		// fall back 2024-11-03 02:00 EDT -> 01:00 EST.
		{"ny daily 02:30 spring gap moves to 03:30 EDT", "30 2 * * *", "America/New_York", "2024-03-09T00:00:00-05:00",
			[]string{"2024-03-09T02:30:00-05:00", "2024-03-10T03:30:00-04:00", "2024-03-11T02:30:00-04:00"}},
		{"ny daily 01:30 fall overlap fires once", "30 1 * * *", "America/New_York", "2024-11-02T00:00:00-04:00",
			[]string{"2024-11-02T01:30:00-04:00", "2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"}},
		{"ny daily 01:30 created in the repeated hour", "30 1 * * *", "America/New_York", "2024-11-03T01:10:00-05:00",
			[]string{"2024-11-04T01:30:00-05:00"}},
		{"ny daily 01:30 created in the first occurrence", "30 1 * * *", "America/New_York", "2024-11-03T01:10:00-04:00",
			[]string{"2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"}},
		{"ny hourly through fall back fires both 01:00", "0 * * * *", "America/New_York", "2024-11-03T00:30:00-04:00",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"}},
		{"ny hourly through spring forward", "@hourly", "America/New_York", "2024-03-10T00:30:00-05:00",
			[]string{"2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T04:00:00-04:00"}},
		{"ny */30 through the gap has no duplicates", "*/30 * * * *", "America/New_York", "2024-03-10T01:00:00-05:00",
			[]string{"2024-03-10T01:00:00-05:00", "2024-03-10T01:30:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T03:30:00-04:00", "2024-03-10T04:00:00-04:00"}},
		{"ny 02:00 and 03:00 collapse in the gap", "0 2,3 * * *", "America/New_York", "2024-03-10T00:00:00-05:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-11T02:00:00-04:00", "2024-03-11T03:00:00-04:00"}},
		{"ny every minute at 01:xx restricted hour skips the repeat", "*/20 1 * * *", "America/New_York", "2024-11-03T00:00:00-04:00",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-03T01:20:00-04:00", "2024-11-03T01:40:00-04:00", "2024-11-04T01:00:00-05:00"}},
		// Europe/Berlin: spring forward 2024-03-31 02:00 CET -> 03:00 CEST,
		// fall back 2024-10-27 03:00 CEST -> 02:00 CET.
		{"berlin daily 02:15 spring gap moves to 03:15 CEST", "15 2 * * *", "Europe/Berlin", "2024-03-30T12:00:00+01:00",
			[]string{"2024-03-31T03:15:00+02:00", "2024-04-01T02:15:00+02:00"}},
		{"berlin daily 02:30 fall overlap fires once", "30 2 * * *", "Europe/Berlin", "2024-10-26T12:00:00+02:00",
			[]string{"2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"}},
		{"berlin hourly through fall back", "0 * * * *", "Europe/Berlin", "2024-10-27T01:30:00+02:00",
			[]string{"2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00", "2024-10-27T03:00:00+01:00"}},
		{"berlin 6-field every 20 min of 02 through the gap", "0 */20 2 * * *", "Europe/Berlin", "2024-03-31T00:00:00+01:00",
			[]string{"2024-03-31T03:00:00+02:00", "2024-03-31T03:20:00+02:00", "2024-03-31T03:40:00+02:00", "2024-04-01T02:00:00+02:00"}},
		{"lord howe 30-minute gap", "15 2 * * *", "Australia/Lord_Howe", "2024-10-05T12:00:00+10:30",
			[]string{"2024-10-06T02:45:00+11:00", "2024-10-07T02:15:00+11:00"}},
		// Leap days.
		{"leap day utc", "0 0 29 2 *", "", "2024-03-01T00:00:00Z",
			[]string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"leap day across 2100", "0 0 29 2 *", "", "2096-03-01T00:00:00Z",
			[]string{"2104-02-29T00:00:00Z", "2108-02-29T00:00:00Z"}},
		{"leap day in new york", "0 12 29 2 *", "America/New_York", "2023-01-01T00:00:00Z",
			[]string{"2024-02-29T12:00:00-05:00", "2028-02-29T12:00:00-05:00"}},
		{"end of february monthly", "0 0 28-29 2 *", "", "2023-02-01T00:00:00Z",
			[]string{"2023-02-28T00:00:00Z", "2024-02-28T00:00:00Z", "2024-02-29T00:00:00Z", "2025-02-28T00:00:00Z"}},
		// Seconds and descriptors.
		{"every 15 seconds from a fraction", "*/15 * * * * *", "", "2024-05-01T10:00:00.250Z",
			[]string{"2024-05-01T10:00:15Z", "2024-05-01T10:00:30Z", "2024-05-01T10:00:45Z", "2024-05-01T10:01:00Z"}},
		{"match at now counts", "*/15 * * * * *", "", "2024-05-01T10:00:15Z",
			[]string{"2024-05-01T10:00:15Z", "2024-05-01T10:00:30Z"}},
		{"6-field with seconds", "30 0 12 * * *", "", "2024-05-01T12:00:31Z",
			[]string{"2024-05-02T12:00:30Z"}},
		{"@daily in berlin", "@daily", "Europe/Berlin", "2024-03-30T12:00:00Z",
			[]string{"2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00"}},
		{"@midnight", "@midnight", "", "2024-05-01T00:00:00.001Z", []string{"2024-05-02T00:00:00Z"}},
		{"@weekly is sunday", "@weekly", "", "2024-05-01T00:00:00Z", []string{"2024-05-05T00:00:00Z", "2024-05-12T00:00:00Z"}},
		{"@monthly", "@monthly", "", "2024-01-31T00:00:00Z", []string{"2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"}},
		{"@yearly", "@yearly", "", "2024-01-01T00:00:01Z", []string{"2025-01-01T00:00:00Z"}},
		{"@annually", "@annually", "", "2024-01-01T00:00:00Z", []string{"2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"}},
		{"weekday names", "0 9 * * MON-FRI", "", "2024-05-03T10:00:00Z", // a Friday
			[]string{"2024-05-06T09:00:00Z", "2024-05-07T09:00:00Z"}},
		{"dom or dow when both set", "0 0 13 * FRI", "", "2024-09-01T00:00:00Z",
			[]string{"2024-09-06T00:00:00Z", "2024-09-13T00:00:00Z", "2024-09-20T00:00:00Z"}},
		{"question mark is star", "0 0 ? * SUN", "", "2024-05-01T00:00:00Z", []string{"2024-05-05T00:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustCompile(t, Spec{Kind: Cron, Cron: tt.cron, TZ: tt.tz})
			got, ok := c.First(ms(t, tt.now), 0)
			for i, w := range tt.want {
				if !ok {
					t.Fatalf("fire %d: none, want %s", i, w)
				}
				if want := ms(t, w); got != want {
					t.Fatalf("fire %d: got %s, want %s (%s)", i, fmtMs(got), fmtMs(want), w)
				}
				got, ok = c.Next(got, int64(i+1))
			}
		})
	}
}

// TestCronDailyOncePerDayAllYear walks a whole year of a daily job in both
// zones, for times in the gap, in the overlap and ordinary ones: one fire per
// local date, never two.
func TestCronDailyOncePerDayAllYear(t *testing.T) {
	for _, tz := range []string{"America/New_York", "Europe/Berlin"} {
		loc, _ := time.LoadLocation(tz)
		for _, expr := range []string{"30 2 * * *", "30 1 * * *", "0 0 * * *", "59 23 * * *", "15 3 * * *"} {
			c := mustCompile(t, Spec{Kind: Cron, Cron: expr, TZ: tz})
			due, ok := c.First(time.Date(2024, 1, 1, 0, 0, 0, 0, loc).UnixMilli(), 0)
			seen := map[string]bool{}
			n := 0
			for ok && due < time.Date(2025, 1, 1, 0, 0, 0, 0, loc).UnixMilli() {
				d := time.UnixMilli(due).In(loc).Format("2006-01-02")
				if seen[d] {
					t.Fatalf("%s %s: fired twice on %s", tz, expr, d)
				}
				seen[d] = true
				n++
				due, ok = c.Next(due, 0)
			}
			if n != 366 {
				t.Fatalf("%s %s: %d fires in 2024, want 366", tz, expr, n)
			}
		}
	}
}

// TestCronHourlyEveryRealHour: an every-hour expression fires once per real
// hour, 366*24 times in 2024, in both zones.
func TestCronHourlyEveryRealHour(t *testing.T) {
	for _, tz := range []string{"America/New_York", "Europe/Berlin"} {
		c := mustCompile(t, Spec{Kind: Cron, Cron: "0 * * * *", TZ: tz})
		start, end := ms(t, "2024-01-01T00:00:00Z"), ms(t, "2025-01-01T00:00:00Z")
		due, ok := c.First(start, 0)
		n := 0
		for ok && due < end {
			if n > 0 && due != start+int64(n)*3600000 {
				t.Fatalf("%s: fire %d at %s", tz, n, fmtMs(due))
			}
			n++
			due, ok = c.Next(due, 0)
		}
		if n != 366*24 {
			t.Fatalf("%s: %d fires, want %d", tz, n, 366*24)
		}
	}
}

// TestCronMatchesRobfigInUTC cross-checks the engine against robfig's own
// Next where it is right: UTC (no DST), within its 5-year search.
func TestCronMatchesRobfigInUTC(t *testing.T) {
	exprs := []string{"* * * * *", "*/7 * * * *", "0 0 * * *", "5 4 * * SUN", "0 22 * * 1-5",
		"23 0-20/2 * * *", "0 0,12 1 */2 *", "0 0 1,15 * 3", "15 14 1 * *", "0 0 29 2 *",
		"*/13 */5 * * * *", "0 0 0 31 * *", "0 30 9 * JAN,JUN *", "@weekly", "@monthly"}
	r := rand.New(rand.NewSource(1))
	for _, e := range exprs {
		sched, err := cronParser.Parse(e)
		if err != nil {
			t.Fatal(err)
		}
		c := mustCompile(t, Spec{Kind: Cron, Cron: e})
		for i := 0; i < 200; i++ {
			from := ms(t, "2020-01-01T00:00:00Z") + r.Int63n(5*365*86400*1000)
			want := sched.(*cron.SpecSchedule).Next(time.UnixMilli(from).UTC())
			got, ok := c.Next(from, 0)
			if !ok || got != want.UnixMilli() {
				t.Fatalf("%q after %s: got %s %v, robfig %s", e, fmtMs(from), fmtMs(got), ok, want)
			}
			if f, _ := c.First(from+1, 0); f != got {
				t.Fatalf("%q: First(x+1)=%s != Next(x)=%s", e, fmtMs(f), fmtMs(got))
			}
		}
	}
}

func TestCronAtTheEndOfTime(t *testing.T) {
	c := mustCompile(t, Spec{Kind: Cron, Cron: "0 0 1 1 *"})
	if d, ok := c.Next(ms(t, "9999-01-01T00:00:00Z"), 0); ok {
		t.Fatalf("got %s past MaxTimeMs", fmtMs(d))
	}
	if d, ok := c.First(1<<62, 0); ok {
		t.Fatalf("huge now: got %d", d)
	}
	if d, ok := c.First(-1<<62, 0); !ok || d != 0 {
		t.Fatalf("negative now clamps to the epoch: got %d %v", d, ok)
	}
}
