package shard

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/wheel"
)

// The retry ladder: one child actor of the shard per delay level, holding the runs
// that wait at that level, and one dead-letter child that announces what exhausted
// the ladder to the alert hooks. The shard's journal holds their truth; after a
// restart the shard core hands every waiting run back to its level.

// Local messages between a shard and its ladder children.
type (
	hold struct {
		runID string
		dueMs int64
	}
	unhold struct{ runID string }
	// RetryDue is a level's word that a run's delay is over.
	RetryDue   struct{ RunID string }
	levelTick  struct{}
	deadLetter struct{ d *messages.DeadLetter }
)

// AlertHook is called for each new dead letter (from the dead-letter actor, never
// from the shard's own goroutine).
type AlertHook interface {
	DeadLetter(ctx context.Context, d *messages.DeadLetter) error
}

// Webhook posts each dead letter as JSON to URL.
type Webhook struct {
	URL     string
	Client  *http.Client
	Timeout time.Duration
}

// DeadLetter implements AlertHook.
func (w Webhook) DeadLetter(ctx context.Context, d *messages.DeadLetter) error {
	body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(d)
	if err != nil {
		return err
	}
	to := w.Timeout
	if to <= 0 {
		to = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	c := w.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook %s: status %d", w.URL, resp.StatusCode)
	}
	return nil
}

// levelActor holds the runs waiting at one ladder level in a timing wheel and sets
// one alarm (the process's alarm clock, as the shard's own wake-ups) to the earliest.
type levelActor struct {
	level  int
	w      *wheel.Wheel
	ids    map[string]wheel.Handle
	names  map[uint64]string
	seq    uint64
	timer  interface{ Stop() bool }
	wakeAt int64
}

func newLevel(level int) *levelActor {
	return &levelActor{level: level, w: wheel.New(time.Now().UnixMilli()), ids: map[string]wheel.Handle{}, names: map[uint64]string{}}
}

func (l *levelActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *hold:
		if h, ok := l.ids[m.runID]; ok {
			l.w.Reschedule(h, m.dueMs)
		} else {
			l.seq++
			l.names[l.seq] = m.runID
			l.ids[m.runID] = l.w.Add(m.dueMs, l.seq)
		}
	case *unhold:
		if h, ok := l.ids[m.runID]; ok {
			if _, p, ok := l.w.Get(h); ok {
				delete(l.names, p)
			}
			l.w.Cancel(h)
			delete(l.ids, m.runID)
		}
	case *levelTick:
		l.wakeAt = 0
		l.w.Advance(time.Now().UnixMilli(), func(_ int64, p uint64) {
			id := l.names[p]
			delete(l.names, p)
			delete(l.ids, id)
			ctx.Send(ctx.Parent(), &RetryDue{RunID: id})
		})
	case *actor.Stopping:
		if l.timer != nil {
			l.timer.Stop()
		}
		return
	default:
		return
	}
	at, ok := l.w.NextDue()
	if !ok || (l.wakeAt != 0 && l.wakeAt <= at) {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.wakeAt = at
	self, sys := ctx.Self(), ctx.ActorSystem()
	l.timer = AfterFunc(time.Until(time.UnixMilli(at)), func() { sys.Root.Send(self, &levelTick{}) })
}

// deadActor announces dead letters to the alert hooks, one at a time, each bounded
// by its own timeout.
type deadActor struct {
	hooks []AlertHook
	log   *slog.Logger
}

func (d *deadActor) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*deadLetter)
	if !ok {
		return
	}
	d.log.Warn("dead letter", "run", m.d.RunId, "job", m.d.JobId, "app", m.d.App, "attempts", m.d.Attempts, "error", m.d.LastError)
	for _, h := range d.hooks {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := h.DeadLetter(c, m.d); err != nil {
			d.log.Warn("dead-letter alert hook failed", "run", m.d.RunId, "err", err)
		}
		cancel()
	}
}

// SetAlertHooks sets the hooks the dead-letter child calls (before the actor starts).
func (a *Actor) SetAlertHooks(h []AlertHook) { a.alerts = h }

func (a *Actor) levelPID(level int) *actor.PID {
	if pid := a.levels[level]; pid != nil {
		return pid
	}
	pid, err := a.ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return newLevel(level) }), "retry-"+strconv.Itoa(level))
	if err != nil {
		a.log.Error("spawn retry level", "level", level, "err", err)
	}
	if a.levels == nil {
		a.levels = map[int]*actor.PID{}
	}
	a.levels[level] = pid
	return pid
}

// Hold implements core.Ladder.
func (a *Actor) Hold(level int, runID string, dueMs int64) {
	a.ctx.Send(a.levelPID(level), &hold{runID: runID, dueMs: dueMs})
}

// Release implements core.Ladder.
func (a *Actor) Release(level int, runID string) {
	if pid := a.levels[level]; pid != nil {
		a.ctx.Send(pid, &unhold{runID: runID})
	}
}

// DeadLettered implements core.Ladder.
func (a *Actor) DeadLettered(d *messages.DeadLetter) {
	if a.dead == nil {
		hooks, log := a.alerts, a.log
		pid, err := a.ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &deadActor{hooks: hooks, log: log} }), "dead-letters")
		if err != nil {
			a.log.Error("spawn dead-letter actor", "err", err)
			return
		}
		a.dead = pid
	}
	a.ctx.Send(a.dead, &deadLetter{d: d})
}
