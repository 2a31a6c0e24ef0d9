package simtry

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

type env struct {
	lsn  uint64
	sent []proto.Message
}

func (e *env) Append(es []persistence.Entry) (uint64, error) { e.lsn += uint64(len(es)); return e.lsn, nil }
func (e *env) Send(to *messages.Ref, m proto.Message)       { e.sent = append(e.sent, m) }

func TestFixedDelay(t *testing.T) {
	now := int64(1_700_000_000_000)
	e := &env{}
	c := shardcore.New(shardcore.Config{Shard: route.Root("a")}, now, 1)
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w", App: "a", Ref: &messages.Ref{Address: "w", Id: "w"}}}, e)
	c.Handle(now, &messages.Ref{Address: "c"}, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "a", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY, EveryMs: 500}}}, e)
	c.Durable(e.lsn, nil, e)
	for i := 0; i < 10; i++ {
		now += 100
		c.Tick(now, e)
		c.Durable(e.lsn, nil, e)
		for _, m := range e.sent {
			if d, ok := m.(*messages.Dispatch); ok {
				fmt.Println("dispatch", d.RunId, "at", now)
				c.Handle(now, &messages.Ref{Address: "w"}, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Epoch: d.Epoch, Attempt: d.Attempt, Outcome: messages.Outcome_SUCCEEDED, EndMs: now}, e)
				c.Durable(e.lsn, nil, e)
			}
		}
		e.sent = nil
	}
	c.Handle(now, &messages.Ref{Address: "c"}, &messages.GetJob{App: "a", Id: 7}, e)
	fmt.Println(e.sent)
}
