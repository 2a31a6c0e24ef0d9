package sim

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// simMsg is a message between actors of one node that has no protobuf form
// (shard.HandedOff): it copies itself.
type simMsg interface{ clone() any }

func cloneMsg(m any) any {
	switch x := m.(type) {
	case proto.Message:
		return proto.Clone(x)
	case simMsg:
		return x.clone()
	}
	panic(fmt.Sprintf("sim: cannot send %T", m))
}

func sortStrings(s []string) { slices.Sort(s) }

// send carries m from the node at src to the actor named by to. from is the sender
// as the receiver sees it (where a reply goes). The message is copied, as a real
// remote would serialize it, so no two nodes ever share a value.
//
// Faults (until the heal): loss, duplication, a long latency tail that reorders,
// partitions (checked at send and at delivery) and slow nodes. A message to a node
// that is down, or that restarted while the message was in flight, is lost.
func (s *Sim) send(src string, from, to *messages.Ref, m any) {
	if to == nil || m == nil {
		return
	}
	dst := to.Address
	n := s.nodes[dst]
	if n == nil {
		s.tracef("net: %s -> %s %s: no such node", src, dst, brief(m))
		return
	}
	s.stats.Messages++
	if src == dst { // local: no network, no faults
		inc := n.incarnation()
		c := cloneMsg(m)
		s.after(0, func() {
			if n.alive() && n.incarnation() == inc {
				n.deliver(from, to, c)
			}
		})
		return
	}
	if s.cut(src, dst) {
		s.stats.Dropped++
		s.tracef("net: %s -> %s %s: partitioned", src, dst, brief(m))
		return
	}
	if s.faulty(FaultLoss) && s.chance(0.02) {
		s.stats.Dropped++
		s.tracef("net: %s -> %s %s: lost", src, dst, brief(m))
		return
	}
	copies := 1
	if s.faulty(FaultDup) && s.chance(0.02) {
		copies = 2
		s.stats.Duplicated++
	}
	inc := n.incarnation()
	for i := range copies {
		lat := s.latency(src, dst)
		c := cloneMsg(m)
		dup := i > 0
		s.after(lat, func() {
			if !n.alive() || n.incarnation() != inc {
				s.tracef("net: %s -> %s %s: receiver down", src, dst, brief(c))
				return
			}
			if s.cut(src, dst) {
				s.stats.Dropped++
				s.tracef("net: %s -> %s %s: partitioned in flight", src, dst, brief(c))
				return
			}
			if dup {
				s.tracef("net: %s -> %s %s (duplicate)", src, dst, brief(c))
			}
			n.deliver(from, to, c)
		})
	}
}

// cut reports whether the partition separates a and b.
func (s *Sim) cut(a, b string) bool { return s.part != nil && s.part[a] != s.part[b] }

// latency draws one message's delay in ms: 1..3 ms usually; with FaultDelay a tail
// of tens of ms (5 %) and of seconds (0.5 %); slow nodes add up to 300 ms.
func (s *Sim) latency(src, dst string) int64 {
	l := s.between(1, 3)
	if s.faulty(FaultDelay) {
		switch r := s.rng.Float64(); {
		case r < 0.005:
			l += s.between(500, 4000)
		case r < 0.055:
			l += s.between(5, 150)
		}
	}
	if s.faulty(FaultSlow) && (s.isSlow(src) || s.isSlow(dst)) {
		l += s.between(0, 300)
	}
	return l
}

// brief is a one-line description of a message for the trace: its type and the
// fields that identify it.
func brief(m any) string {
	switch x := m.(type) {
	case *messages.CreateJob:
		return fmt.Sprintf("CreateJob{%d v%d}", x.Job.GetId(), x.Job.GetVersion())
	case *messages.UpdateJob:
		return fmt.Sprintf("UpdateJob{%d}", x.Job.GetId())
	case *messages.DeleteJob:
		return fmt.Sprintf("DeleteJob{%d}", x.Id)
	case *messages.PauseJob:
		return fmt.Sprintf("PauseJob{%d}", x.Id)
	case *messages.ResumeJob:
		return fmt.Sprintf("ResumeJob{%d}", x.Id)
	case *messages.TriggerJob:
		return fmt.Sprintf("TriggerJob{%d}", x.Id)
	case *messages.GetJob:
		return fmt.Sprintf("GetJob{%d}", x.Id)
	case *messages.JobReply:
		if x.Error != nil {
			return fmt.Sprintf("JobReply{%s %q}", x.Error.Code, x.Error.Message)
		}
		j := x.Job
		return fmt.Sprintf("JobReply{%d v%d %s next=%d runs=%d}", j.GetId(), j.GetVersion(), j.GetState(), j.GetNextDueMs(), j.GetRuns())
	case *messages.Dispatch:
		return fmt.Sprintf("Dispatch{%s#%d %s e%d}", x.RunId, x.Attempt, x.Handler, x.Epoch)
	case *messages.RunResult:
		return fmt.Sprintf("RunResult{%s#%d %s e%d %s}", x.RunId, x.Attempt, x.Outcome, x.Epoch, x.WorkerId)
	case *messages.ResultAck:
		return fmt.Sprintf("ResultAck{%s}", x.RunId)
	case *messages.ServerHeartbeat:
		var sh []string
		for _, l := range x.Shards {
			f := ""
			if l.Frozen {
				f = "*"
			}
			sh = append(sh, fmt.Sprintf("%s@%d%s", l.Shard, l.Epoch, f))
		}
		return fmt.Sprintf("ServerHeartbeat{%s [%s]}", x.ServerId, strings.Join(sh, " "))
	case *messages.WorkerHeartbeat:
		return fmt.Sprintf("WorkerHeartbeat{%s}", x.Worker.GetWorkerId())
	case *messages.RouteTable:
		var rs []string
		for _, r := range x.Routes {
			rs = append(rs, fmt.Sprintf("%s@%d:%s", r.Shard, r.Epoch, r.Owner.GetAddress()))
		}
		e := ""
		if x.Error != nil {
			e = " " + x.Error.Code.String()
		}
		return fmt.Sprintf("RouteTable{v%d [%s] apps=%d%s}", x.Version, strings.Join(rs, " "), len(x.Apps), e)
	case *messages.GetRoutes:
		return fmt.Sprintf("GetRoutes{%s ensure=%v}", x.App, x.Ensure)
	case *messages.AssignShard:
		return fmt.Sprintf("AssignShard{%s@%d}", x.Shard, x.Epoch)
	case *messages.ShardOpened:
		return fmt.Sprintf("ShardOpened{%s %s}", x.ServerId, x.Shard.GetShard())
	case *messages.LeaseNode:
		return fmt.Sprintf("LeaseNode{%s %d}", x.Holder, x.Node)
	case *messages.LeaseNodeReply:
		if x.Error != nil {
			return fmt.Sprintf("LeaseNodeReply{%s}", x.Error.Code)
		}
		return fmt.Sprintf("LeaseNodeReply{%d}", x.Node)
	case *messages.MoveShard:
		return fmt.Sprintf("MoveShard{%s@%d to %s split=%v}", x.Shard, x.Epoch, x.Target.GetAddress(), x.Split)
	case *messages.ImportShard:
		return fmt.Sprintf("ImportShard{%s@%d %dB}", x.Shard, x.Epoch, len(x.Snapshot))
	case *messages.ImportShardReply:
		if x.Error != nil {
			return fmt.Sprintf("ImportShardReply{%s %q}", x.Error.Code, x.Error.Message)
		}
		return fmt.Sprintf("ImportShardReply{%s@%d}", x.Shard.GetShard(), x.Shard.GetEpoch())
	case *handedOff:
		return fmt.Sprintf("HandedOff{%s}", x.Shard)
	}
	return fmt.Sprintf("%T", m)
}
