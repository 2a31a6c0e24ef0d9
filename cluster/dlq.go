package cluster

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

func jobOfRun(runID string) (int64, error) {
	i := strings.IndexByte(runID, ':')
	if i <= 0 {
		return 0, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "run_id", Message: fmt.Sprintf("%q is not a run id (job:due)", runID)}
	}
	id, err := strconv.ParseInt(runID[:i], 10, 64)
	if err != nil || id <= 0 {
		return 0, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "run_id", Message: fmt.Sprintf("%q is not a run id (job:due)", runID)}
	}
	return id, nil
}

// fanOut sends m to every shard of app and returns the replies.
func (c *Client) fanOut(ctx context.Context, app string, m proto.Message) ([]any, error) {
	if err := c.refresh(ctx, app, false); err != nil {
		return nil, err
	}
	c.mu.Lock()
	rs := append([]*messages.RouteEntry(nil), c.routes[app]...)
	c.mu.Unlock()
	out := make([]any, 0, len(rs))
	for _, r := range rs {
		rep, err := c.request(ctx, actor.NewPID(r.Owner.Address, r.Owner.Id), m)
		if err != nil {
			return nil, err
		}
		if err := replyError(rep); err != nil {
			return nil, err
		}
		out = append(out, rep)
	}
	return out, nil
}

// DeadLetters lists an app's dead letters in run id order, paginated by run id.
func (c *Client) DeadLetters(ctx context.Context, app, afterRunID string, limit int) ([]*messages.DeadLetter, string, error) {
	if limit <= 0 {
		limit = 100
	}
	lim, err := wireLimit(limit)
	if err != nil {
		return nil, "", err
	}
	reps, err := c.fanOut(ctx, app, &messages.ListDeadLetters{App: app, AfterRunId: afterRunID, Limit: lim})
	if err != nil {
		return nil, "", err
	}
	var all []*messages.DeadLetter
	more := false
	for _, r := range reps {
		lr := r.(*messages.DeadLettersReply)
		all = append(all, lr.Letters...)
		more = more || lr.NextAfterRunId != ""
	}
	sort.Slice(all, func(a, b int) bool { return all[a].RunId < all[b].RunId })
	if len(all) > limit {
		all, more = all[:limit], true
	}
	next := ""
	if more && len(all) > 0 {
		next = all[len(all)-1].RunId
	}
	return all, next, nil
}

func (c *Client) dlqCall(ctx context.Context, app, runID string, m proto.Message) (*messages.DeadLetterReply, error) {
	id, err := jobOfRun(runID)
	if err != nil {
		return nil, err
	}
	r, err := c.call(ctx, app, id, false, m)
	if err != nil {
		return nil, err
	}
	if err := replyError(r); err != nil {
		return nil, err
	}
	return r.(*messages.DeadLetterReply), nil
}

// DeadLetter returns one dead letter.
func (c *Client) DeadLetter(ctx context.Context, app, runID string) (*messages.DeadLetter, error) {
	r, err := c.dlqCall(ctx, app, runID, &messages.GetDeadLetter{App: app, RunId: runID})
	if err != nil {
		return nil, err
	}
	return r.Letter, nil
}

// Replay takes a dead letter out of the queue and runs it again as a fresh attempt
// through the retry ladder.
func (c *Client) Replay(ctx context.Context, app, runID string) (*messages.DeadLetter, error) {
	r, err := c.dlqCall(ctx, app, runID, &messages.ReplayDeadLetter{App: app, RunId: runID, RequestId: c.NewID()})
	if err != nil {
		return nil, err
	}
	return r.Letter, nil
}

// Purge deletes one dead letter, or all of an app's when runID is "".
func (c *Client) Purge(ctx context.Context, app, runID string) (int, error) {
	if runID != "" {
		r, err := c.dlqCall(ctx, app, runID, &messages.PurgeDeadLetters{App: app, RunId: runID, RequestId: c.NewID()})
		if err != nil {
			return 0, err
		}
		return int(r.Purged), nil
	}
	reps, err := c.fanOut(ctx, app, &messages.PurgeDeadLetters{App: app, RequestId: c.NewID()})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range reps {
		n += int(r.(*messages.DeadLetterReply).Purged)
	}
	return n, nil
}
