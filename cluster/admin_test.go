package cluster_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
)

// TestAdminAPI exercises every endpoint of the HTTP admin API, and its error answers,
// on one node with a worker.
func TestAdminAPI(t *testing.T) {
	n := obsNode(t, nil)
	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		return obsCall(t, n, method, path, body)
	}

	// Health answers at once; readiness says why not until the node serves.
	if st, b := call("GET", "/healthz", ""); st != http.StatusOK || b["status"] != "ok" {
		t.Fatalf("/healthz: %d %v", st, b)
	}
	if st, b := call("GET", "/readyz", ""); st == http.StatusServiceUnavailable {
		if b["ready"] != false || obsStr(b, "reason") == "" {
			t.Fatalf("/readyz not ready without a reason: %v", b)
		}
	} else if st != http.StatusOK || b["ready"] != true {
		t.Fatalf("/readyz: %d %v", st, b)
	}
	obsWorker(t, n, "shop", nil, map[string]cluster.HandlerFunc{
		"echo": func(context.Context, *cluster.Run) error { return nil },
		"fail": func(context.Context, *cluster.Run) error { return errors.New("boom") },
	})
	obsReady(t, n)

	// Create: params may be a JSON object; the answer is protojson (params as base64).
	st, job := call("POST", "/v1/jobs", `{"app":"shop","handler":"echo","params":{"order":42},"schedule":{"kind":"ONCE","delay_ms":3600000}}`)
	if st != http.StatusCreated || obsStr(job, "id") == "" || obsStr(job, "state") != "ACTIVE" {
		t.Fatalf("create: %d %v", st, job)
	}
	if p, _ := base64.StdEncoding.DecodeString(obsStr(job, "params")); string(p) != `{"order":42}` {
		t.Fatalf("params stored as %q", p)
	}
	id := obsStr(job, "id")
	jobPath := "/v1/jobs/shop/" + id
	t.Run("create errors", func(t *testing.T) {
		for _, c := range []struct{ body, field string }{
			{`{"app":"shop","handler":"echo","schedule":{"kind":"CRON","cron":"61 * * * *"}}`, "schedule.cron"},
			{`{"app":"shop","schedule":{"kind":"ONCE"}}`, "handler"},
			{`{"handler":"echo","schedule":{"kind":"ONCE"}}`, "app"},
			{`{"app":"shop","handler":"echo","bogus":1}`, "body"},
			{`not json`, "body"},
			{`{"app":"shop","handler":"echo","params":"not base64!","schedule":{"kind":"ONCE"}}`, "body"},
		} {
			st, b := call("POST", "/v1/jobs", c.body)
			obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", c.field)
		}
		big := `{"app":"shop","handler":"echo","params":"` + strings.Repeat("A", 2<<20) + `"}`
		st, b := call("POST", "/v1/jobs", big)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "body")
		// Same id, different definition.
		st, b = call("POST", "/v1/jobs", `{"id":"`+id+`","app":"shop","handler":"other","schedule":{"kind":"ONCE","delay_ms":3600000}}`)
		obsErr(t, st, b, http.StatusConflict, "ALREADY_EXISTS", obsStr(b, "error", "field"))
	})

	t.Run("get", func(t *testing.T) {
		if st, b := call("GET", jobPath, ""); st != http.StatusOK || obsStr(b, "id") != id || obsStr(b, "handler") != "echo" {
			t.Fatalf("get: %d %v", st, b)
		}
		st, b := call("GET", "/v1/jobs/shop/12345", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
		st, b = call("GET", "/v1/jobs/shop/abc", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "id")
		t0 := time.Now()
		st, b = call("GET", "/v1/jobs/nosuchapp/1", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "app")
		if time.Since(t0) > 2*time.Second {
			t.Fatalf("an unknown app took %s to answer", time.Since(t0))
		}
		st, b = call("GET", "/v1/jobs/bad%20app/1", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "app")
	})

	t.Run("update", func(t *testing.T) {
		st, b := call("PUT", jobPath, `{"handler":"echo","params":{"order":43},"schedule":{"kind":"ONCE","delay_ms":7200000}}`)
		if st != http.StatusOK || obsStr(b, "version") != "2" {
			t.Fatalf("update: %d %v", st, b)
		}
		st, b = call("PUT", jobPath, `{"id":"1","handler":"echo","schedule":{"kind":"ONCE"}}`)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "id")
		st, b = call("PUT", jobPath, `{"app":"other","handler":"echo","schedule":{"kind":"ONCE"}}`)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "app")
		st, b = call("PUT", jobPath, `{"handler":"echo","schedule":{"kind":"FIXED_RATE"}}`)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "schedule.every")
		st, b = call("PUT", "/v1/jobs/shop/12345", `{"handler":"echo","schedule":{"kind":"ONCE","delay_ms":1000}}`)
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
	})

	t.Run("pause resume", func(t *testing.T) {
		if st, b := call("POST", jobPath+"/pause", ""); st != http.StatusOK || obsStr(b, "state") != "PAUSED" {
			t.Fatalf("pause: %d %v", st, b)
		}
		if st, b := call("GET", "/v1/jobs?app=shop&state=paused", ""); st != http.StatusOK || len(b["jobs"].([]any)) != 1 {
			t.Fatalf("list paused: %d %v", st, b)
		}
		if st, b := call("POST", jobPath+"/resume", ""); st != http.StatusOK || obsStr(b, "state") != "ACTIVE" {
			t.Fatalf("resume: %d %v", st, b)
		}
		st, b := call("POST", "/v1/jobs/shop/12345/pause", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
		st, b = call("POST", "/v1/jobs/shop/12345/resume", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
	})

	t.Run("list", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			if st, b := call("POST", "/v1/jobs", `{"app":"shop","handler":"echo","schedule":{"kind":"API_ONLY"}}`); st != http.StatusCreated {
				t.Fatalf("create: %d %v", st, b)
			}
		}
		st, b := call("GET", "/v1/jobs?app=shop&limit=2", "")
		next := obsStr(b, "next_after_id")
		if st != http.StatusOK || len(b["jobs"].([]any)) != 2 || next == "" {
			t.Fatalf("page 1: %d %v", st, b)
		}
		st, b = call("GET", "/v1/jobs?app=shop&limit=2&after="+next, "")
		if st != http.StatusOK || len(b["jobs"].([]any)) != 2 || obsStr(b, "next_after_id") != "" {
			t.Fatalf("page 2: %d %v", st, b)
		}
		if st, b := call("GET", "/v1/jobs?app=shop&handler=nothing", ""); st != http.StatusOK || len(b["jobs"].([]any)) != 0 {
			t.Fatalf("list by handler: %d %v", st, b)
		}
		if st, b := call("GET", "/v1/jobs?app=nosuchapp", ""); st != http.StatusOK || len(b["jobs"].([]any)) != 0 {
			t.Fatalf("list of an unknown app: %d %v", st, b)
		}
		for _, c := range []struct{ q, field string }{
			{"", "app"}, {"?app=shop&state=bogus", "state"}, {"?app=shop&limit=x", "limit"},
			{"?app=shop&after=-1", "after"}, {"?app=shop&limit=5000", "limit"},
		} {
			st, b := call("GET", "/v1/jobs"+c.q, "")
			obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", c.field)
		}
	})

	t.Run("trigger and runs", func(t *testing.T) {
		if st, b := call("POST", jobPath+"/trigger", `{"params":{"order":44}}`); st != http.StatusOK || obsStr(b, "id") != id {
			t.Fatalf("trigger: %d %v", st, b)
		}
		var runs []any
		obsWait(t, 10*time.Second, "the triggered run in the history", func() bool {
			st, b := call("GET", jobPath+"/runs?limit=5", "")
			runs, _ = b["runs"].([]any)
			return st == http.StatusOK && len(runs) == 1 && obsStr(runs[0], "outcome") == "SUCCEEDED"
		})
		if obsStr(runs[0], "trace_id") == "" || !strings.HasPrefix(obsStr(runs[0], "run_id"), id+":") {
			t.Fatalf("run: %v", runs[0])
		}
		if st, b := call("POST", jobPath+"/trigger", ""); st != http.StatusOK {
			t.Fatalf("trigger without a body: %d %v", st, b)
		}
		st, b := call("POST", jobPath+"/trigger", `{"params":"!!"}`)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "params")
		st, b = call("POST", jobPath+"/trigger", `{"other":1}`)
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "body")
		st, b = call("POST", "/v1/jobs/shop/12345/trigger", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
		st, b = call("GET", "/v1/jobs/shop/12345/runs", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
		st, b = call("GET", jobPath+"/runs?limit=-3", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "limit")
	})

	t.Run("dead letters", func(t *testing.T) {
		st, b := call("POST", "/v1/jobs", `{"app":"shop","handler":"fail","policy":{"attempts":1},"schedule":{"kind":"ONCE","delay_ms":10}}`)
		if st != http.StatusCreated {
			t.Fatalf("create: %d %v", st, b)
		}
		var letters []any
		obsWait(t, 10*time.Second, "a dead letter", func() bool {
			_, b := call("GET", "/v1/dlq/shop", "")
			letters, _ = b["dead_letters"].([]any)
			return len(letters) == 1
		})
		runID := obsStr(letters[0], "run_id")
		if st, b := call("GET", "/v1/dlq/shop/"+runID, ""); st != http.StatusOK || obsStr(b, "last_error") != "boom" {
			t.Fatalf("get dead letter: %d %v", st, b)
		}
		st, b = call("GET", "/v1/dlq/shop/"+obsStr(letters[0], "job_id")+":1", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "run_id")
		st, b = call("GET", "/v1/dlq/shop/garbage", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "run_id")
		// Replay: it fails again and comes back as a new dead letter.
		if st, b := call("POST", "/v1/dlq/shop/"+runID+"/replay", ""); st != http.StatusOK || obsStr(b, "run_id") != runID {
			t.Fatalf("replay: %d %v", st, b)
		}
		st, b = call("POST", "/v1/dlq/shop/"+runID+"/replay", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "run_id")
		obsWait(t, 10*time.Second, "the replayed run's dead letter", func() bool {
			_, b := call("GET", "/v1/dlq/shop", "")
			letters, _ = b["dead_letters"].([]any)
			return len(letters) == 1 && obsStr(letters[0], "run_id") != runID
		})
		second := obsStr(letters[0], "run_id")
		if st, b := call("DELETE", "/v1/dlq/shop/"+second, ""); st != http.StatusOK || obsStr(b, "purged") != "1" {
			t.Fatalf("purge one: %d %v", st, b)
		}
		st, b = call("DELETE", "/v1/dlq/shop/"+second, "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "run_id")
		st, b = call("DELETE", "/v1/dlq/shop", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "all")
		if st, b := call("DELETE", "/v1/dlq/shop?all=true", ""); st != http.StatusOK || obsStr(b, "purged") != "0" {
			t.Fatalf("purge all: %d %v", st, b)
		}
		if st, b := call("GET", "/v1/dlq/nosuchapp", ""); st != http.StatusOK || len(b["dead_letters"].([]any)) != 0 {
			t.Fatalf("dead letters of an unknown app: %d %v", st, b)
		}
		st, b = call("GET", "/v1/dlq/nosuchapp/1:2", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "app")
		st, b = call("GET", "/v1/dlq/shop?limit=zz", "")
		obsErr(t, st, b, http.StatusBadRequest, "INVALID_ARGUMENT", "limit")
	})

	t.Run("delete", func(t *testing.T) {
		if st, b := call("DELETE", jobPath, ""); st != http.StatusOK || obsStr(b, "id") != id {
			t.Fatalf("delete: %d %v", st, b)
		}
		st, b := call("GET", jobPath, "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
		st, b = call("DELETE", jobPath, "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "id")
	})

	t.Run("cluster", func(t *testing.T) {
		st, b := call("GET", "/v1/cluster", "")
		servers, _ := b["servers"].([]any)
		if st != http.StatusOK || len(servers) != 1 || obsStr(servers[0], "address") != n.Address() || obsStr(b, "nameserver") == "" {
			t.Fatalf("cluster: %d %v", st, b)
		}
	})

	t.Run("routing errors", func(t *testing.T) {
		st, b := call("GET", "/v1/nothing", "")
		obsErr(t, st, b, http.StatusNotFound, "NOT_FOUND", "")
		st, b = call("PATCH", "/v1/jobs", "")
		obsErr(t, st, b, http.StatusMethodNotAllowed, "INVALID_ARGUMENT", "method")
		if !strings.Contains(obsStr(b, "error", "message"), "POST") {
			t.Fatalf("405 does not say what is allowed: %v", b)
		}
	})
}
