package core

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Snapshot encodes the whole shard state. Take it only when Quiescent, and store it
// at AppliedLSN: it then covers exactly the durable journal.
func (c *Core) Snapshot() []byte {
	return c.snapshotOf(c.cfg.Shard, c.epoch, nil, 1)
}

// snapshotOf encodes the part of the state that belongs to shard sh (keep reports
// whether a job id does; nil keeps everything) as sh's snapshot at epoch. share
// scales the fire-window figure (a split half takes its share of the load).
func (c *Core) snapshotOf(sh route.Shard, epoch int64, keep func(int64) bool, share float64) []byte {
	in := func(id int64) bool { return keep == nil || keep(id) }
	s := &messages.ShardSnapshot{Meta: &messages.ShardMeta{Shard: sh.String(), Epoch: epoch}}
	ids := make([]int64, 0, len(c.jobs))
	for id := range c.jobs {
		if in(id) {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	for _, id := range ids {
		j := c.jobs[id]
		s.Jobs = append(s.Jobs, j.j)
		s.History = append(s.History, j.history...)
	}
	seqs := make([]uint64, 0, len(c.bySeq))
	for seq, r := range c.bySeq {
		if in(r.st.JobId) {
			seqs = append(seqs, seq)
		}
	}
	sort.Slice(seqs, func(a, b int) bool { return seqs[a] < seqs[b] })
	for _, seq := range seqs {
		s.Runs = append(s.Runs, c.bySeq[seq].st)
	}
	dids := make([]string, 0, len(c.dead))
	for id, d := range c.dead {
		if in(d.JobId) {
			dids = append(dids, id)
		}
	}
	sort.Strings(dids)
	for _, id := range dids {
		s.Dead = append(s.Dead, c.dead[id])
	}
	for _, r := range c.reqs.entries() {
		if in(r.JobId) {
			s.Requests = append(s.Requests, r)
		}
	}
	for i := range c.fireWin {
		s.FireWindow = append(s.FireWindow, int64(float64(c.fireWin[i])*share+0.5))
		s.FireWindowSec = append(s.FireWindowSec, c.fireWinSec[i])
	}
	b, err := proto.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("shard: marshal snapshot: %v", err))
	}
	return b
}

// LoadSnapshot replaces the state with a snapshot's (recovery, before Replay).
func (c *Core) LoadSnapshot(data []byte, lsn uint64) error {
	s := &messages.ShardSnapshot{}
	if err := proto.Unmarshal(data, s); err != nil {
		return fmt.Errorf("shard %s: snapshot at lsn %d: %w", c.cfg.Shard, lsn, err)
	}
	if s.Meta.GetEpoch() > c.epoch {
		c.epoch = s.Meta.GetEpoch()
	}
	for _, r := range s.Requests { // first, oldest first: the window keeps its order
		c.reqs.add(r.RequestId, r.JobId, r.AtMs)
	}
	for _, j := range s.Jobs {
		c.apply(messages.RecordType_JOB_PUT, j)
	}
	for _, h := range s.History {
		if j := c.jobs[h.JobId]; j != nil {
			j.history = append(j.history, h)
		}
	}
	for _, st := range s.Runs {
		if st.Level >= 0 {
			c.apply(messages.RecordType_RETRY_SCHEDULED, st)
		} else {
			st2 := proto.Clone(st).(*messages.RunState)
			st2.Fire = false // its effect on the job is in the job already
			c.apply(messages.RecordType_RUN_DISPATCHED, st2)
		}
	}
	for _, d := range s.Dead {
		c.dead[d.RunId] = d
	}
	if len(s.FireWindow) == len(c.fireWin) && len(s.FireWindowSec) == len(c.fireWin) {
		copy(c.fireWin[:], s.FireWindow)
		copy(c.fireWinSec[:], s.FireWindowSec)
	}

	c.appended, c.durable = lsn, lsn
	return nil
}

// ShardNameOfSnapshot reads the shard name and epoch from a snapshot blob.
func ShardNameOfSnapshot(data []byte) (string, int64, error) {
	s := &messages.ShardSnapshot{}
	if err := proto.Unmarshal(data, s); err != nil {
		return "", 0, err
	}
	return s.Meta.GetShard(), s.Meta.GetEpoch(), nil
}
