package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

// TestObsErrorStatus: every kjob error code has its HTTP status and JSON body, and
// errors that are not kjob's get the code the Go client's caller would branch on.
func TestObsErrorStatus(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
		field  string
	}{
		{&kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "schedule.cron", Message: "bad"}, 400, "INVALID_ARGUMENT", "schedule.cron"},
		{&kerr.Error{Code: messages.Code_NOT_FOUND, Field: "id", Message: "no job"}, 404, "NOT_FOUND", "id"},
		{&kerr.Error{Code: messages.Code_ALREADY_EXISTS, Field: "id", Message: "differs"}, 409, "ALREADY_EXISTS", "id"},
		{&kerr.Error{Code: messages.Code_NOT_OWNER, Message: "moved", Hint: &messages.Ref{Address: "10.0.0.2:7070", Id: "x"}}, 421, "NOT_OWNER", ""},
		{&kerr.Error{Code: messages.Code_UNAVAILABLE, Message: "warming up"}, 503, "UNAVAILABLE", ""},
		{&kerr.Error{Code: messages.Code_RESOURCE_EXHAUSTED, Message: "full"}, 429, "RESOURCE_EXHAUSTED", ""},
		{&kerr.Error{Code: messages.Code_RESOURCE_EXHAUSTED, Field: "journal", Message: "out of disk space"}, 507, "RESOURCE_EXHAUSTED", "journal"},
		{&kerr.Error{Code: messages.Code_FAILED_PRECONDITION, Message: "frozen"}, 412, "FAILED_PRECONDITION", ""},
		{&kerr.Error{Code: messages.Code_INTERNAL, Message: "oops"}, 500, "INTERNAL", ""},
		{fmt.Errorf("wrapped: %w", &kerr.Error{Code: messages.Code_NOT_FOUND, Field: "run_id", Message: "gone"}), 404, "NOT_FOUND", "run_id"},
		{fmt.Errorf("lease: %w (last error: x)", context.DeadlineExceeded), 503, "UNAVAILABLE", ""},
		{fmt.Errorf("%w (last error: %w)", context.DeadlineExceeded, &kerr.Error{Code: messages.Code_NOT_OWNER, Message: "moved"}), 503, "UNAVAILABLE", ""},
		{fmt.Errorf("%w (last error: %w)", context.Canceled, &kerr.Error{Code: messages.Code_UNAVAILABLE, Field: "x", Message: "warming up"}), 503, "UNAVAILABLE", ""},
		{fmt.Errorf("%w: 127.0.0.1:1: timeout", errTransport), 503, "UNAVAILABLE", ""},
		{errors.New("something else"), 500, "INTERNAL", ""},
	} {
		w := httptest.NewRecorder()
		writeError(w, c.err)
		var body struct {
			Error struct {
				Code, Field, Message string
				Hint                 *messages.Ref
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", c.err, w.Body.String(), err)
		}
		if w.Code != c.status || body.Error.Code != c.code || body.Error.Field != c.field || body.Error.Message == "" {
			t.Errorf("%v: got %d %s, want %d %s field %q", c.err, w.Code, w.Body.String(), c.status, c.code, c.field)
		}
		if w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%v: Content-Type %q", c.err, w.Header().Get("Content-Type"))
		}
		if c.code == "NOT_OWNER" && body.Error.Hint.GetAddress() != "10.0.0.2:7070" {
			t.Errorf("NOT_OWNER lost its hint: %s", w.Body.String())
		}
	}
	if httpStatus(messages.Code_NOT_OWNER) != http.StatusMisdirectedRequest {
		t.Fatal("NOT_OWNER is not 421")
	}
}
