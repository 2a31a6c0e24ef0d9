package cluster

import (
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/kjob/kjob/actors/nameserver"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/messages"
)

// Membership timing.
const (
	peerPollInterval = 300 * time.Millisecond
	peerPollTimeout  = 250 * time.Millisecond
	peerMissesToDrop = 4 // consecutive missed polls before a member is dropped
)

// peerProvider is a proto.actor cluster provider that needs no external service:
// every member pings the server actor of each address in a static peer list (the
// same list on every node, like etcd's initial cluster) over the proto.actor remote
// itself, and publishes the members that answer. A member is dropped only after
// peerMissesToDrop consecutive misses, so one slow poll does not evict it.
type peerProvider struct {
	peers  []string
	self   string
	log    *slog.Logger
	stop   chan struct{}
	wg     sync.WaitGroup
	c      *cluster.Cluster
	misses map[string]int
	last   map[string]*cluster.Member
}

func newPeerProvider(self string, peers []string, log *slog.Logger) *peerProvider {
	return &peerProvider{peers: peers, self: self, log: log, stop: make(chan struct{}),
		misses: map[string]int{}, last: map[string]*cluster.Member{}}
}

func (p *peerProvider) StartMember(c *cluster.Cluster) error {
	p.c = c
	p.publish(p.poll())
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(peerPollInterval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.publish(p.poll())
			}
		}
	}()
	return nil
}

func (p *peerProvider) StartClient(c *cluster.Cluster) error { return p.StartMember(c) }

func (p *peerProvider) Shutdown(bool) error {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
	return nil
}

func (p *peerProvider) poll() map[string]*cluster.Member {
	type answer struct {
		addr string
		m    *cluster.Member
	}
	ch := make(chan answer, len(p.peers)+1)
	for _, addr := range p.peers {
		go func(addr string) {
			ch <- answer{addr, p.ping(addr)}
		}(addr)
	}
	out := map[string]*cluster.Member{}
	for range p.peers {
		a := <-ch
		if a.m != nil {
			p.misses[a.addr] = 0
			p.last[a.addr] = a.m
			out[a.addr] = a.m
			continue
		}
		p.misses[a.addr]++
		if m := p.last[a.addr]; m != nil && p.misses[a.addr] < peerMissesToDrop {
			out[a.addr] = m
		}
	}
	return out
}

func (p *peerProvider) ping(addr string) *cluster.Member {
	sys := p.c.ActorSystem
	var pong *messages.Pong
	if addr == p.self {
		pong = &messages.Pong{ServerId: sys.ID, Address: sys.Address()}
	} else {
		r, err := sys.Root.RequestFuture(actor.NewPID(addr, server.Name), &messages.Ping{}, peerPollTimeout).Result()
		if err != nil {
			return nil
		}
		var ok bool
		if pong, ok = r.(*messages.Pong); !ok {
			return nil
		}
	}
	host, port, err := net.SplitHostPort(pong.Address)
	if err != nil {
		return nil
	}
	pn, _ := strconv.Atoi(port)
	return &cluster.Member{Id: pong.ServerId, Host: host, Port: int32(pn), Kinds: []string{nameserver.Kind}}
}

func (p *peerProvider) publish(ms map[string]*cluster.Member) {
	members := make(cluster.Members, 0, len(ms))
	for _, addr := range p.peers {
		if m := ms[addr]; m != nil {
			members = append(members, m)
		}
	}
	p.c.MemberList.UpdateClusterTopology(members)
}
