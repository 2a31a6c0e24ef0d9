// Package kerr holds kjob's typed errors: the wire form (*messages.Error) and the Go
// form (*Error, usable with errors.Is against the sentinels below).
package kerr

import (
	"errors"
	"fmt"

	"github.com/kjob/kjob/messages"
)

// Sentinels callers branch on with errors.Is.
var (
	ErrInvalidArgument    = errors.New("kjob: invalid argument")
	ErrNotFound           = errors.New("kjob: not found")
	ErrAlreadyExists      = errors.New("kjob: already exists")
	ErrNotOwner           = errors.New("kjob: not owner")
	ErrUnavailable        = errors.New("kjob: unavailable")
	ErrResourceExhausted  = errors.New("kjob: resource exhausted")
	ErrFailedPrecondition = errors.New("kjob: failed precondition")
	ErrInternal           = errors.New("kjob: internal error")
)

var sentinels = map[messages.Code]error{
	messages.Code_INVALID_ARGUMENT:    ErrInvalidArgument,
	messages.Code_NOT_FOUND:           ErrNotFound,
	messages.Code_ALREADY_EXISTS:      ErrAlreadyExists,
	messages.Code_NOT_OWNER:           ErrNotOwner,
	messages.Code_UNAVAILABLE:         ErrUnavailable,
	messages.Code_RESOURCE_EXHAUSTED:  ErrResourceExhausted,
	messages.Code_FAILED_PRECONDITION: ErrFailedPrecondition,
	messages.Code_INTERNAL:            ErrInternal,
}

// Error is a typed kjob error. Field names the request field at fault, when one is.
type Error struct {
	Code    messages.Code
	Field   string
	Message string
	Hint    *messages.Ref
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", codeName(e.Code), e.Field, e.Message)
	}
	return fmt.Sprintf("%s: %s", codeName(e.Code), e.Message)
}

// Is makes errors.Is(err, kerr.ErrNotFound) work.
func (e *Error) Is(target error) bool { return sentinels[e.Code] == target }

func codeName(c messages.Code) string {
	switch c {
	case messages.Code_INVALID_ARGUMENT:
		return "invalid argument"
	case messages.Code_NOT_FOUND:
		return "not found"
	case messages.Code_ALREADY_EXISTS:
		return "already exists"
	case messages.Code_NOT_OWNER:
		return "not owner"
	case messages.Code_UNAVAILABLE:
		return "unavailable"
	case messages.Code_RESOURCE_EXHAUSTED:
		return "resource exhausted"
	case messages.Code_FAILED_PRECONDITION:
		return "failed precondition"
	default:
		return "internal"
	}
}

// FromWire converts a wire error to a Go error; nil or code OK gives nil.
func FromWire(w *messages.Error) error {
	if w == nil || w.Code == messages.Code_OK {
		return nil
	}
	return &Error{Code: w.Code, Field: w.Field, Message: w.Message, Hint: w.Hint}
}

// ToWire converts any error to its wire form; a non-kjob error becomes INTERNAL.
func ToWire(err error) *messages.Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return &messages.Error{Code: e.Code, Field: e.Field, Message: e.Message, Hint: e.Hint}
	}
	return &messages.Error{Code: messages.Code_INTERNAL, Message: err.Error()}
}

// New builds a wire error.
func New(code messages.Code, field, format string, args ...any) *messages.Error {
	return &messages.Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Invalid builds an INVALID_ARGUMENT wire error naming field.
func Invalid(field, format string, args ...any) *messages.Error {
	return New(messages.Code_INVALID_ARGUMENT, field, format, args...)
}
