package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Handoffs move a shard between servers at epoch+1. The NameServer core has no
// balancer yet and the server shell no handoff, so the simulator carries one out
// itself, built only from the shard core's API, with the steps DESIGN.md names
// ("freeze writes, flush, stream snapshot + tail to the target, target persists
// and activates at epoch+1, owner drops its copy only after the target
// confirms"):
//
//	source                                   target
//	Freeze (refuse commands, stop firing)
//	wait until Quiescent
//	journal [intent(target), SHARD_CLOSED]
//	on durable: send Snapshot ──────────────▶ journal recSnapshot (epoch+1, data)
//	  (resend every second until done)        on durable: New(epoch+1), LoadSnapshot,
//	                                          Recovered, Open; reply done
//	journal recDropped, forget the shard ◀─── done
//
// A crash at any step leaves exactly one active owner with the highest epoch:
// SHARD_CLOSED is durable before the snapshot leaves, so a restarted source comes
// back frozen (and resumes the handoff from its intent record); the target is the
// owner only once its snapshot record is durable; a target remembers (recDropped
// carries the epoch) the highest epoch it ever held, so a late resend cannot bring
// back a copy it has since handed on.

type handoffSnapshot struct {
	Shard string
	Epoch int64 // the target's epoch: source epoch + 1
	Data  []byte
	From  string // the source server's address
}

func (m *handoffSnapshot) clone() any {
	c := *m
	c.Data = append([]byte(nil), m.Data...)
	return &c
}

type handoffDone struct {
	Shard string
	Epoch int64
}

func (m *handoffDone) clone() any { c := *m; return &c }

// moveOut is a handoff in progress at its source.
type moveOut struct {
	to    string
	epoch int64
	phase int
}

const (
	moveQuiescing = iota // frozen, waiting for the journal to catch up
	moveClosing          // SHARD_CLOSED appended, waiting for it to be durable
	moveSent             // snapshot sent, waiting for done
)

// moveShard starts a handoff of a random active shard to another live server.
func (s *Sim) moveShard() {
	var ups []*server
	for _, v := range s.servers {
		if v.up && v.j.failed == nil {
			ups = append(ups, v)
		}
	}
	if len(ups) < 2 {
		return
	}
	var cands []*shardHost
	for _, v := range ups {
		for _, n := range v.hostNames() {
			h := v.shards[n]
			if !h.core.Frozen() && h.core.Failed() == nil && h.move == nil {
				cands = append(cands, h)
			}
		}
	}
	if len(cands) == 0 {
		return
	}
	h := cands[s.rng.IntN(len(cands))]
	var targets []*server
	for _, v := range ups {
		if v != h.srv {
			targets = append(targets, v)
		}
	}
	h.startMove(targets[s.rng.IntN(len(targets))].addr)
}

func (h *shardHost) startMove(to string) {
	epoch := h.core.Epoch() + 1
	h.move = &moveOut{to: to, epoch: epoch}
	h.core.Freeze(&messages.Error{Code: messages.Code_NOT_OWNER, Message: fmt.Sprintf("shard %s is moving to %s", h.name, to),
		Hint: &messages.Ref{Address: to, Id: shardPrefix + h.name}, HintEpoch: epoch})
	h.srv.s.stats.Moves++
	h.srv.s.tracef("move: %s@%d from %s to %s at epoch %d: frozen", h.name, h.core.Epoch(), h.srv.addr, to, epoch)
	h.progressMove()
}

// resumeMove continues the handoff of a shard that came back frozen after a restart.
func (h *shardHost) resumeMove(to string) {
	h.move = &moveOut{to: to, epoch: h.core.Epoch() + 1, phase: moveSent}
	h.srv.s.tracef("move: %s@%d resumes its handoff to %s after restart", h.name, h.core.Epoch(), to)
	h.sendSnapshot()
}

func (h *shardHost) progressMove() {
	m := h.move
	if m.phase != moveQuiescing || !h.core.Quiescent() || h.core.Failed() != nil {
		return
	}
	m.phase = moveClosing
	v := h.srv
	entries := []persistence.Entry{
		{Stream: h.core.Stream(), Type: recIntent, Payload: []byte(m.to)},
		{Stream: h.core.Stream(), Type: uint8(messages.RecordType_SHARD_CLOSED),
			Payload: mustMarshal(&messages.ShardMeta{Shard: h.name, Epoch: h.core.Epoch()})},
	}
	if _, err := v.j.append(nil, entries, func(_ uint64, err error) {
		if err == nil && !h.gone && h.move == m {
			h.sendSnapshot()
		}
	}); err != nil {
		v.s.tracef("move: %s: cannot close: %v (abandoned until restart)", h.name, err)
	}
}

func (h *shardHost) sendSnapshot() {
	m := h.move
	m.phase = moveSent
	v := h.srv
	data := h.core.Snapshot()
	inc := v.inc
	to := &messages.Ref{Address: m.to, Id: serverActorID}
	send := func() bool {
		if h.gone || h.move != m || !v.up || v.inc != inc {
			return false
		}
		v.s.send(v.addr, v.ref, to, &handoffSnapshot{Shard: h.name, Epoch: m.epoch, Data: data, From: v.addr})
		return true
	}
	v.s.tracef("move: %s closed on %s; snapshot of %d bytes to %s", h.name, v.addr, len(data), m.to)
	send()
	v.s.every(1000, 0, send)
}

// handoffIn persists a shard sent here, then activates it at the new epoch.
func (v *server) handoffIn(from *messages.Ref, m *handoffSnapshot) {
	done := func() {
		v.s.send(v.addr, v.ref, &messages.Ref{Address: m.From, Id: serverActorID}, &handoffDone{Shard: m.Shard, Epoch: m.Epoch})
	}
	if h := v.shards[m.Shard]; h != nil && h.core.Epoch() >= m.Epoch {
		done()
		return
	}
	sh, err := route.Parse(m.Shard)
	if err != nil {
		v.s.failf("handoff", "%s: bad shard name %q in a handoff: %v", v.addr, m.Shard, err)
		return
	}
	if e := v.droppedEpochs[sh.Stream()]; e >= m.Epoch {
		done() // held here once and handed on since: the source may drop its copy
		return
	}
	if e, ok := v.incoming[m.Shard]; (ok && e >= m.Epoch) || v.j.failed != nil {
		return
	}
	v.incoming[m.Shard] = m.Epoch
	v.s.tracef("move: %s@%d arrives on %s from %s; persisting", m.Shard, m.Epoch, v.addr, m.From)
	data := m.Data
	_, _ = v.j.append(nil, []persistence.Entry{{Stream: sh.Stream(), Type: recSnapshot, Payload: encodeSnapshotRecord(m.Epoch, data)}},
		func(lsn uint64, err error) {
			if v.incoming[m.Shard] == m.Epoch {
				delete(v.incoming, m.Shard)
			}
			if err != nil {
				return
			}
			if h := v.shards[m.Shard]; h != nil && h.core.Epoch() >= m.Epoch {
				done()
				return
			}
			now := v.now()
			c := shardcore.New(v.shardConfig(sh), now, m.Epoch)
			if err := c.LoadSnapshot(data, lsn); err != nil {
				v.s.failf("handoff", "%s: load snapshot of %s: %v", v.addr, m.Shard, err)
				return
			}
			h := v.host(c)
			h.shadow = shardcore.New(v.shardConfig(sh), now, m.Epoch)
			_ = h.shadow.LoadSnapshot(data, lsn)
			viewFromSnapshot(h.view, h.next, data)
			delete(v.groups, h.name)
			c.Recovered(now, lsn, h)
			c.Open(h)
			h.after()
			v.s.tracef("move: %s@%d active on %s (%d jobs, %d runs)", h.name, c.Epoch(), v.addr, c.Jobs(), c.InFlight())
			v.s.chk.ownersChanged()
			v.pushWorkers()
			done()
		})
}

// handoffDone drops the source's copy once the target holds the shard.
func (v *server) handoffDone(m *handoffDone) {
	h := v.shards[m.Shard]
	if h == nil || h.move == nil || h.move.epoch != m.Epoch {
		return
	}
	var e [8]byte
	binary.LittleEndian.PutUint64(e[:], uint64(h.core.Epoch()))
	_, _ = v.j.append(nil, []persistence.Entry{{Stream: h.core.Stream(), Type: recDropped, Payload: e[:]}}, nil)
	h.gone = true
	delete(v.shards, m.Shard)
	delete(v.groups, m.Shard)
	v.droppedEpochs[h.core.Stream()] = h.core.Epoch()
	sh := h.core.Shard()
	v.handedTo[m.Shard] = &messages.RouteEntry{Shard: m.Shard, App: sh.App, Level: int32(sh.Level), Index: sh.Index,
		Owner: (&server{addr: h.move.to}).shardRef(m.Shard), Epoch: m.Epoch} // no server id: any report replaces it
	v.s.stats.MovesDone++
	v.s.tracef("move: %s@%d dropped on %s; %s holds epoch %d", m.Shard, h.core.Epoch(), v.addr, h.move.to, m.Epoch)
	v.s.chk.ownersChanged()
	if v.s.faulty(FaultMove) && v.s.chance(0.7) {
		// A flapping balancer: move it straight back. Results of the dispatches made
		// before the first move then reach the same shard address at a newer epoch.
		to, name := h.move.to, m.Shard
		v.s.after(v.s.between(10, 400), func() {
			t := v.s.nodes[to].(*server)
			if !v.s.faulty(FaultMove) || !v.up || !t.up {
				return
			}
			if b := t.shards[name]; b != nil && active(b) && b.move == nil && t.j.failed == nil && v.j.failed == nil {
				b.startMove(v.addr)
			}
		})
	}
}
