package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

// TestExitCodes: each kind of failure exits with its own status; a client that gave
// up at its deadline (the cluster could not serve in time) exits as unavailable,
// whatever the last error it saw.
func TestExitCodes(t *testing.T) {
	gaveUp := func(last error) error { return fmt.Errorf("%w (last error: %w)", context.DeadlineExceeded, last) }
	for _, tc := range []struct {
		err  error
		want int
	}{
		{&kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "schedule.cron", Message: "bad"}, 2},
		{&kerr.Error{Code: messages.Code_NOT_FOUND, Message: "job 7"}, 3},
		{&kerr.Error{Code: messages.Code_ALREADY_EXISTS, Message: "job 7"}, 4},
		{&kerr.Error{Code: messages.Code_UNAVAILABLE, Message: "journal failed"}, 5},
		{gaveUp(&kerr.Error{Code: messages.Code_UNAVAILABLE, Message: "journal failed"}), 5},
		{gaveUp(errors.New("transport: connection refused")), 5},
		{gaveUp(&kerr.Error{Code: messages.Code_NOT_OWNER, Message: "moved"}), 5},
		{errors.New("something else"), 1},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
