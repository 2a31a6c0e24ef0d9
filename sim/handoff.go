package sim

import (
	"encoding/binary"
	"fmt"
	"maps"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Handoffs and splits are the real protocol: the NameServer core decides them and
// sends MoveShard to the owner; the shard core journals and freezes (BeginHandoff,
// BeginSplit), builds the imports (HandoffImports) and closes (HandoffDone); the
// shells around them are re-done here from actors/server/server.go (MoveShard,
// importShard, movedOn, HandedOff), actors/shard/handoff.go (tryHandoff,
// importNext) and cluster/node.go (recover):
//
//	source shard                              target server (a split: its own server)
//	MoveShard → BeginHandoff/BeginSplit
//	  (SHARD_HANDOFF journaled, frozen)
//	once Quiescent, for each import ────────▶ importShard: an older or equal copy here,
//	  (one for a move, two halves for a        moved on since (handedOn, routes): answer;
//	  split; timeout grows with the size;      else check and load the snapshot, journal
//	  any failure: retry after HandoffRetry)   SHARD_IMPORTED, on durable activate at
//	                                ◀───────── epoch+1 (Recovered) and answer
//	after the last answer: HandoffDone
//	  (SHARD_CLOSED), HandedOff to the server:
//	  handedOn saved, then the stream dropped
//
// A crash at any step leaves exactly one active owner with the highest epoch: the
// target is an owner only once SHARD_IMPORTED is durable; a source that restarts
// with SHARD_HANDOFF and no SHARD_CLOSED comes back frozen and resumes (the target
// answers a repeat without a second copy); one with SHARD_CLOSED finishes dropping
// its stream (recover). handedOn (the real HandedOnStore, a file written durably
// before the stream is dropped) survives crashes, so a late repeat of an import this
// server has since handed on brings back no stale copy.

// handoffRetryMs is shard.HandoffRetry: the wait before a failed import is retried.
const handoffRetryMs = 1000

// handoffTimeoutMs is the shard shell's import timeout: 2 s plus the snapshot at
// 4 MiB/s, at most 60 s (actors/shard/handoff.go, handoffTimeout).
func handoffTimeoutMs(snapshotBytes int) int64 {
	return min(2000+int64(snapshotBytes)*1000/(4<<20), 60_000)
}

// handedOff is shard.HandedOff: the shard's copy here is closed (local message).
type handedOff struct{ Shard string }

func (m *handedOff) clone() any { c := *m; return &c }

// ---------------------------------------------------------------- MoveShard

// moveShard is the server's MoveShard handler (actors/server, Receive).
func (v *server) moveShard(m *messages.MoveShard, injected bool) {
	if !m.Split && m.Target.GetAddress() == v.addr && m.Target.GetId() == serverActorID {
		v.s.tracef("%s: move of %s to the server it is on: ignored", v.addr, m.Shard)
		return
	}
	h := v.shards[m.Shard]
	if h == nil || h.core.Epoch() != m.Epoch || m.Target == nil || !h.reported() {
		return // real: no child (spawned only once durable) or another epoch
	}
	began := h.core.Handoff() == nil && !h.core.Closed() && h.core.Failed() == nil
	target := &messages.Ref{Address: m.Target.Address, Id: m.Target.Id}
	if m.Split {
		h.core.BeginSplit(target, h)
	} else {
		h.core.BeginHandoff(target, h) // ignored by a core already handing off
		v.movingTo[m.Shard] = target   // as actors/server: set even then
	}
	if !began || h.core.Handoff() == nil {
		return // the core ignored it (a handoff in progress, a split past MaxLevel)
	}
	v.s.stats.Moves++
	if !injected {
		v.s.stats.MoveOrders++
	}
	what := "move to " + target.Address
	if m.Split {
		what = "split"
	}
	v.s.chk.began[m.Shard] = v.s.now
	v.s.tracef("handoff: %s@%d on %s begins (%s)", m.Shard, m.Epoch, v.addr, what)
	h.after()
}

// injectMove is the `move` fault: the server is told to move (or split) a random
// shard, as if the NameServer had decided it — a flapping or confused balancer.
func (s *Sim) injectMove() {
	var ups []*server
	for _, v := range s.servers {
		if v.up {
			ups = append(ups, v)
		}
	}
	var cands []*shardHost
	for _, v := range ups {
		for _, n := range v.hostNames() {
			if h := v.shards[n]; active(h) && h.reported() && h.core.Handoff() == nil {
				cands = append(cands, h)
			}
		}
	}
	if len(cands) == 0 {
		return
	}
	h := cands[s.rng.IntN(len(cands))]
	split := len(ups) < 2 || s.chance(0.05)
	s.orderMove(h, ups, split)
}

// orderMove sends h's server a MoveShard for h: a split, or a move to another of ups.
func (s *Sim) orderMove(h *shardHost, ups []*server, split bool) {
	target := h.srv.ref
	if !split {
		var others []*server
		for _, v := range ups {
			if v != h.srv {
				others = append(others, v)
			}
		}
		if len(others) == 0 {
			return
		}
		target = others[s.rng.IntN(len(others))].ref
	}
	s.tracef("chaos: %s is told to %s %s@%d", h.srv.addr, map[bool]string{true: "split", false: "move to " + target.Address}[split], h.name, h.core.Epoch())
	h.srv.moveShard(&messages.MoveShard{Shard: h.name, Target: target, Epoch: h.core.Epoch(), Split: split}, true)
}

// ---------------------------------------------------------------- source: the shard shell

// tryHandoff is the shard shell's tryHandoff: once the core is quiescent, send its
// imports to the target one after the other.
func (h *shardHost) tryHandoff() {
	target := h.core.Handoff()
	if target == nil || h.gone || h.handoffBusy || h.handoffWait || !h.core.Quiescent() || h.core.Failed() != nil {
		return
	}
	h.handoffBusy = true
	h.importNext(target, h.core.HandoffImports(), 0)
}

// importNext sends imports[i] to target, then the next; after the last is confirmed
// the copy here closes. Any failure retries the whole handoff after handoffRetryMs.
func (h *shardHost) importNext(target *messages.Ref, imports []*messages.ImportShard, i int) {
	v := h.srv
	if i == len(imports) {
		h.handoffBusy = false
		split := len(imports) > 1
		h.core.HandoffDone(h)
		v.s.stats.MovesDone++
		if split {
			v.s.stats.SplitsDone++
			v.s.tracef("handoff: %s split into %s and %s at epoch %d", h.name, imports[0].Shard, imports[1].Shard, imports[0].Epoch)
		} else {
			v.s.tracef("handoff: %s handed off to %s at epoch %d", h.name, target.Address, imports[0].Epoch)
		}
		v.s.send(v.addr, h.ref, v.ref, &handedOff{Shard: h.name})
		return
	}
	im := imports[i]
	v.request(target, im, handoffTimeoutMs(len(im.Snapshot)), func(r *messages.ImportShardReply, err error) {
		if h.gone {
			return
		}
		if err == nil {
			if e := shardcore.ImportConfirmed(im, r); e != nil {
				err = fmt.Errorf("%s: %s", e.Code, e.Message)
			}
		}
		if err != nil {
			h.handoffBusy, h.handoffWait = false, true
			v.s.tracef("handoff: %s: import of %s@%d to %s failed: %v; retrying", h.name, im.Shard, im.Epoch, target.Address, err)
			v.s.after(handoffRetryMs, func() {
				if h.gone {
					return
				}
				h.handoffWait = false
				h.after()
			})
			return
		}
		h.importNext(target, imports, i+1)
	})
}

// request sends m to an actor and calls done with its reply, or with an error after
// timeoutMs (proto.actor's RequestFuture). The reply comes to a future address of
// its own, so a late or duplicated answer finds nothing.
func (v *server) request(to *messages.Ref, m proto.Message, timeoutMs int64, done func(*messages.ImportShardReply, error)) {
	v.futureN++
	id := futurePrefix + strconv.Itoa(v.futureN)
	v.futures[id] = done
	inc := v.inc
	v.s.after(timeoutMs, func() {
		if f := v.futures[id]; f != nil && v.up && v.inc == inc {
			delete(v.futures, id)
			f(nil, fmt.Errorf("no answer within %d ms", timeoutMs))
		}
	})
	v.s.send(v.addr, &messages.Ref{Address: v.addr, Id: id}, to, m)
}

func (v *server) answered(id string, m any) {
	f := v.futures[id]
	r, ok := m.(*messages.ImportShardReply)
	if f == nil || !ok {
		return
	}
	delete(v.futures, id)
	f(r, nil)
}

// handedOff is the server's shard.HandedOff handler: forget the shard, save the
// epoch it was handed on at, then drop its stream.
func (v *server) handedOff(m *handedOff) {
	h := v.shards[m.Shard]
	if h == nil {
		return
	}
	h.gone = true
	delete(v.shards, m.Shard)
	delete(v.groups, m.Shard)
	e := h.core.Epoch() + 1
	v.handedOn[m.Shard] = max(v.handedOn[m.Shard], e)
	v.saveHandedOn()
	v.dropStream(h.core.Stream(), h.core.Epoch())
	if to := v.movingTo[m.Shard]; to != nil {
		sh := h.core.Shard()
		v.handedTo[m.Shard] = &messages.RouteEntry{Shard: m.Shard, App: sh.App, Level: int32(sh.Level), Index: sh.Index,
			Owner: &messages.Ref{Address: to.Address, Id: shardPrefix + m.Shard}, Epoch: e}
		delete(v.movingTo, m.Shard)
		if v.s.faulty(FaultMove) && v.s.chance(0.7) {
			// A flapping balancer: move it straight back. Results of the dispatches
			// made before the first move then reach the same shard address at a newer
			// epoch.
			v.s.after(v.s.between(1, 200), func() {
				t, ok := v.s.nodes[to.Address].(*server)
				if !ok || !v.s.faulty(FaultMove) || !v.up || !t.up {
					return
				}
				if b := t.shards[m.Shard]; b != nil && active(b) && b.reported() && b.core.Handoff() == nil {
					v.s.orderMove(b, []*server{v, t}, false)
				}
			})
		}
	}
	v.s.tracef("handoff: %s@%d dropped on %s (handed on at epoch %d)", m.Shard, h.core.Epoch(), v.addr, e)
	v.s.chk.ownersChanged()
}

// saveHandedOn is HandedOnStore.Save: written durably before it returns (a file
// of its own, outside the journal: crashes keep it).
func (v *server) saveHandedOn() { v.handedOnFile = maps.Clone(v.handedOn) }

// dropStream is persistence.Journal.DropStream: a record that makes recovery forget
// every earlier record of the stream (its payload, the epoch dropped, is for the
// trace only).
func (v *server) dropStream(stream uint64, epoch int64) {
	var e [8]byte
	binary.LittleEndian.PutUint64(e[:], uint64(epoch))
	j := v.j
	lsn, err := j.append(nil, []persistence.Entry{{Stream: stream, Type: recDropped, Payload: e[:]}}, func(_ uint64, err error) {
		// Once the tombstone is durable, the stream's snapshots go (an older one
		// would otherwise bring the stream back at recovery).
		if err == nil && j.d.snaps[stream].lsn < j.drops[stream] {
			delete(j.d.snaps, stream)
		}
	})
	if err != nil {
		v.s.tracef("%s: drop stream %x: %v (kept)", v.addr, stream, err)
		return
	}
	if j.drops == nil {
		j.drops = map[uint64]uint64{}
	}
	j.drops[stream] = lsn
}

// ---------------------------------------------------------------- target: importShard

// importShard is the server's importShard: persist a shard handed here (one
// SHARD_IMPORTED record holding all of it) before answering, then activate it at
// the new epoch. A repeat is answered the same way without a second copy. The real
// server actor waits for the record's fsync inside its handler, so nothing else
// reaches it meanwhile: the simulated one queues what arrives (busy).
func (v *server) importShard(from *messages.Ref, m *messages.ImportShard) {
	reply := func(r *messages.ImportShardReply) { v.s.send(v.addr, v.ref, from, r) }
	sh, err := route.Parse(m.Shard)
	if err != nil {
		reply(&messages.ImportShardReply{Error: kerr.Invalid("shard", "%v", err)})
		return
	}
	if h := v.shards[m.Shard]; h != nil {
		switch {
		case !h.reported():
			reply(&messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "shard %s is being opened here; try again", m.Shard)})
		case h.core.Epoch() >= m.Epoch:
			reply(&messages.ImportShardReply{Shard: h.load()})
		default:
			reply(&messages.ImportShardReply{Error: kerr.New(messages.Code_FAILED_PRECONDITION, "epoch",
				"shard %s is here at epoch %d, below the import's %d", m.Shard, h.core.Epoch(), m.Epoch)})
		}
		return
	}
	if l := v.movedOn(m.Shard, m.Epoch); l != nil {
		v.s.tracef("handoff: %s: import of %s@%d, moved on since (epoch %d): answered without importing", v.addr, m.Shard, m.Epoch, l.Epoch)
		reply(&messages.ImportShardReply{Shard: l})
		return
	}
	if name, epoch, err := shardcore.ShardNameOfSnapshot(m.Snapshot); err != nil || name != m.Shard || epoch != m.Epoch {
		reply(&messages.ImportShardReply{Error: kerr.Invalid("snapshot", "shard %s epoch %d: snapshot holds %q epoch %d (%v)", m.Shard, m.Epoch, name, epoch, err)})
		return
	}
	c := shardcore.New(v.shardConfig(sh), v.now(), m.Epoch)
	if err := c.LoadSnapshot(m.Snapshot, 0); err != nil {
		reply(&messages.ImportShardReply{Error: kerr.Invalid("snapshot", "%v", err)})
		return
	}
	v.checkLoaded(m.Shard, fmt.Sprintf("the import at epoch %d", m.Epoch), m.Snapshot, c)
	data := m.Snapshot
	v.busy = true
	_, err = v.j.append(nil, []persistence.Entry{{Stream: sh.Stream(), Type: uint8(messages.RecordType_SHARD_IMPORTED), Payload: data}},
		func(lsn uint64, err error) {
			v.busy = false
			defer v.drain()
			if err != nil {
				reply(&messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "persist imported shard %s: %v", m.Shard, err)})
				return
			}
			now := v.now()
			h := v.host(c)
			h.shadow = shardcore.New(v.shardConfig(sh), now, m.Epoch)
			_ = h.shadow.LoadSnapshot(data, lsn)
			viewFromSnapshot(h.view, h.next, data)
			h.durable = lsn
			began, ok := v.s.chk.began[m.Shard]
			if !ok {
				began = v.s.chk.began[sh.Parent().String()]
			}
			h.activeSince = now - (v.s.now - began)
			delete(v.groups, h.name)
			c.Recovered(now, lsn, h)
			h.after()
			v.s.stats.Imports++
			v.s.tracef("handoff: %s@%d active on %s (%d jobs, %d runs)", h.name, c.Epoch(), v.addr, c.Jobs(), c.InFlight())
			v.s.chk.ownersChanged()
			v.pushWorkers()
			l := h.load()
			if ns := v.s.ns; ns != nil {
				v.s.send(v.addr, v.ref, ns.ref, &messages.ShardOpened{ServerId: v.id, Shard: l})
			}
			reply(&messages.ImportShardReply{Shard: l})
		})
	if err != nil {
		v.busy = false
		reply(&messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "persist imported shard %s: %v", m.Shard, err)})
	}
}

// drain delivers what reached the server actor while it was busy, in order.
func (v *server) drain() {
	for !v.busy && len(v.queue) > 0 && v.up {
		q := v.queue[0]
		v.queue = v.queue[1:]
		v.receive(q.from, q.m)
	}
}

// movedOn is the server's movedOn: has shard been held at epoch (or later) and
// moved on since, as far as this server knows (handedOn, kept across restarts, or
// a later epoch in the route table)?
func (v *server) movedOn(shard string, epoch int64) *messages.ShardLoad {
	if e, ok := v.handedOn[shard]; ok && e >= epoch {
		l := &messages.ShardLoad{Shard: shard, Epoch: e}
		for _, r := range v.table.GetRoutes() {
			if r.Shard == shard && r.Epoch > e {
				l.Epoch, l.Pid = r.Epoch, r.Owner
			}
		}
		return l
	}
	for _, r := range v.table.GetRoutes() {
		if r.Shard == shard && r.Epoch > epoch {
			return &messages.ShardLoad{Shard: shard, Epoch: r.Epoch, Pid: r.Owner}
		}
	}
	return nil
}
