package schedule

import (
	"errors"
	"fmt"
)

// ErrInvalid is matched (errors.Is) by every *Error this package returns.
var ErrInvalid = errors.New("schedule: invalid input")

// Field names used in *Error.Field. They are the request field at fault, in
// the spelling the API and CLI use.
const (
	FieldKind      = "kind"
	FieldAt        = "at"
	FieldCron      = "cron"
	FieldTZ        = "tz"
	FieldEvery     = "every"
	FieldStart     = "start"
	FieldNotBefore = "not_before"
	FieldNotAfter  = "not_after"
	FieldMaxRuns   = "max_runs"
	FieldMisfire   = "misfire"
	FieldLadder    = "ladder"
)

// Error is a malformed-input error: Field is the field at fault, Reason says
// what is wrong and, where there is one, the limit.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string { return "schedule." + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}
