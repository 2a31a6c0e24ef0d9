package schedule

import (
	"errors"
	"testing"
	"time"
)

// ms parses an RFC 3339 time (with offset) to Unix milliseconds.
func ms(t testing.TB, s string) int64 {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("bad test time %q: %v", s, err)
	}
	return tm.UnixMilli()
}

func fmtMs(v int64) string { return time.UnixMilli(v).UTC().Format(time.RFC3339Nano) }

func mustCompile(t testing.TB, s Spec) *Compiled {
	t.Helper()
	c, err := Compile(s)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", s, err)
	}
	return c
}

func wantField(t testing.TB, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error naming %q, got nil", field)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is %T, not *Error", err, err)
	}
	if e.Field != field {
		t.Fatalf("error %q names field %q, want %q", err, e.Field, field)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("errors.Is(%q, ErrInvalid) is false", err)
	}
	if want := "schedule." + field + ": "; len(err.Error()) <= len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("error text %q does not start with %q", err, want)
	}
}
