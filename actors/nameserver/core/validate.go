package core

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Limits on what workers and clients send to the NameServer (through any server).
// What the NameServer keeps of a worker goes into every route table it pushes to
// every server, so each field is bounded: a worker entry stays under 1.3 KiB, and
// MaxWorkers of them under cluster.MaxMessageBytes (a push past it would be dropped
// on the wire, and with it every route change, for as long as the entry lived).
const (
	MaxWorkerIDLen    = 128    // bytes of a worker id
	MaxWorkerCapacity = 10_000 // handler pool slots a worker may report (0 = the worker's default)
	MaxRefLen         = 512    // bytes of a reference's address, and of its actor id
	MaxHolderLen      = 256    // bytes of a node lease's holder
	MaxWorkers        = 1 << 16
	MaxSubscribers    = 1 << 14 // clients subscribed to route pushes at once
)

// Limits on what servers send the NameServer (ServerHeartbeat, ShardOpened) and
// it sends back to them (RouteTable, AssignShard, MoveShard), and servers send each
// other (ImportShard). What the NameServer keeps of a heartbeat becomes routes in
// every push to every server and client, so a route is checked whole before it is
// kept: a canonical shard name of a valid app, its app, level and index agreeing
// with the name, an owner to send to, an epoch in range.
const (
	MaxServerIDLen = 256 // bytes of a server's member id (its actor system's id)
	// MaxRoutes bounds each list of shards in a heartbeat (the shards a server
	// holds, the hearsay it passes on, the shards it is opening): that many routes
	// are some 50 MB, under cluster.MaxMessageBytes. A server passes on at most
	// that much hearsay (actors/server knownRoutes).
	MaxRoutes = 1 << 18
	// MaxEpoch bounds a shard's epoch: it grows by one a handoff, so no real shard
	// comes near it, and epoch+1 (a handoff's target) cannot wrap.
	MaxEpoch = 1 << 53
	// MaxShardNameLen is the longest shard name: an app of route.MaxAppLen, the
	// deepest level and its highest index ("/20/1048575").
	MaxShardNameLen = route.MaxAppLen + 11
	// MaxFiresWindow bounds a shard's fires in the sliding minute (about 18
	// billion a second): the NameServer sums them per server and compares them
	// with thresholds, which a huge figure would overflow.
	MaxFiresWindow     = 1 << 40
	MaxJournalErrorLen = 4096 // bytes of a server's journal error
)

// Check says what is wrong with a message a worker or client sends to the
// NameServer, nil when nothing is: the error names the field and, where there is
// one, the limit. The NameServer checks every such message before it keeps or acts
// on anything of it, and a server checks it before forwarding it (so the error
// comes back even when the NameServer is on another node, and the NameServer's
// observers see only what it would keep). A server's own messages to the
// NameServer (ServerHeartbeat, ShardOpened) are checked here too, by the NameServer
// only (a server forwards none). A message of another type passes.
func Check(m proto.Message) *messages.Error {
	switch m := m.(type) {
	case *messages.WorkerHeartbeat:
		if m.Worker == nil {
			return kerr.Invalid("worker", "is required: the worker's id, app, reference and capacity")
		}
		return ValidWorker(m.Worker)
	case *messages.WorkerLeft:
		if e := validText("worker_id", m.WorkerId, MaxWorkerIDLen); e != nil {
			return e
		}
		if why := route.ValidApp(m.App); why != "" {
			return kerr.Invalid("app", "%s", why)
		}
	case *messages.GetRoutes:
		if m.App == "" && m.Ensure {
			return kerr.Invalid("app", "must not be empty to place an app")
		}
		if m.App != "" { // "" = every app
			if why := route.ValidApp(m.App); why != "" {
				return kerr.Invalid("app", "%s", why)
			}
		}
	case *messages.Subscribe:
		return validRef("subscriber", m.Subscriber)
	case *messages.ServerHeartbeat:
		return validServerHeartbeat(m)
	case *messages.ShardOpened:
		if m.Error != nil {
			return nil // a failed open: nothing is kept of it
		}
		if e := validText("server_id", m.ServerId, MaxServerIDLen); e != nil {
			return e
		}
		return Under("shard", validShardLoad(m.Shard))
	case *messages.LeaseNode:
		if e := validText("holder", m.Holder, MaxHolderLen); e != nil {
			return e
		}
		if m.Node < -1 || m.Node >= MaxNodes {
			return kerr.Invalid("node", "must be -1 (a new one) or 0 to %d, got %d", MaxNodes-1, m.Node)
		}
	}
	return nil
}

// ValidWorker checks a worker's registration; the error names the field
// ("worker.worker_id", ...) and the limit.
func ValidWorker(w *messages.WorkerInfo) *messages.Error {
	if e := validText("worker.worker_id", w.WorkerId, MaxWorkerIDLen); e != nil {
		return e
	}
	if why := route.ValidApp(w.App); why != "" {
		return kerr.Invalid("worker.app", "%s", why)
	}
	if e := validRef("worker.ref", w.Ref); e != nil {
		return e
	}
	// 0 is the worker's default (the shard assumes 64); the busy count is only
	// reported, but it travels in every push like the rest.
	if w.Capacity < 0 || w.Capacity > MaxWorkerCapacity {
		return kerr.Invalid("worker.capacity", "must be 0 (the default) to %d, got %d", MaxWorkerCapacity, w.Capacity)
	}
	if w.Busy < 0 || w.Busy > MaxWorkerCapacity {
		return kerr.Invalid("worker.busy", "must be 0 to %d, got %d", MaxWorkerCapacity, w.Busy)
	}
	return nil
}

// validServerHeartbeat checks a server's heartbeat whole: a server's shards become
// routes, its hearsay too (for a NameServer that has none yet), its opening shards
// hold their apps, and its reference receives every push and order.
func validServerHeartbeat(hb *messages.ServerHeartbeat) *messages.Error {
	if e := validText("server_id", hb.ServerId, MaxServerIDLen); e != nil {
		return e
	}
	if e := validRef("server", hb.Server); e != nil {
		return e
	}
	if hb.Address != "" { // "" is handled: an assignment then waits for this server id only
		if e := validText("address", hb.Address, MaxRefLen); e != nil {
			return e
		}
	}
	for _, f := range [...]struct {
		name string
		n    int
	}{{"shards", len(hb.Shards)}, {"known", len(hb.Known)}, {"opening", len(hb.Opening)}} {
		if f.n > MaxRoutes {
			return kerr.Invalid(f.name, "holds %d entries, the limit is %d", f.n, MaxRoutes)
		}
	}
	for i, l := range hb.Shards {
		if e := validShardLoad(l); e != nil {
			return Under(fmt.Sprintf("shards[%d]", i), e)
		}
	}
	for i, r := range hb.Known {
		if e := ValidRoute(r); e != nil {
			return Under(fmt.Sprintf("known[%d]", i), e)
		}
	}
	for i, n := range hb.Opening {
		if _, e := ValidShard("", n); e != nil {
			return Under(fmt.Sprintf("opening[%d]", i), e)
		}
	}
	if len(hb.JournalError) > MaxJournalErrorLen {
		return kerr.Invalid("journal_error", "is %d bytes, the limit is %d", len(hb.JournalError), MaxJournalErrorLen)
	}
	if !utf8.ValidString(hb.JournalError) { // it goes into the cluster's status, which must marshal
		return kerr.Invalid("journal_error", "is not valid UTF-8")
	}
	for _, f := range [...]struct {
		name string
		v    float64
	}{{"cpu", hb.Cpu}, {"mem", hb.Mem}, {"success_rate", hb.SuccessRate}} {
		if !(f.v >= 0 && f.v <= 1) { // NaN too
			return kerr.Invalid(f.name, "must be a fraction from 0 to 1, got %v", f.v)
		}
	}
	if hb.Incarnation < 0 {
		return kerr.Invalid("incarnation", "must be 0 (unknown) or more, got %d", hb.Incarnation)
	}
	return nil
}

// validShardLoad checks a shard a server reports holding: it becomes its route.
func validShardLoad(l *messages.ShardLoad) *messages.Error {
	if l == nil {
		return kerr.Invalid("", "is required: the shard's name, epoch, load and reference")
	}
	if _, e := ValidShard("shard", l.Shard); e != nil {
		return e
	}
	if e := validEpoch("epoch", l.Epoch, 0); e != nil {
		return e
	}
	if l.Pending < 0 {
		return kerr.Invalid("pending", "must be 0 or more, got %d", l.Pending)
	}
	if l.FiresWindow < 0 || l.FiresWindow > MaxFiresWindow {
		return kerr.Invalid("fires_window", "must be 0 to %d, got %d", int64(MaxFiresWindow), l.FiresWindow)
	}
	if l.FiresTotal < 0 {
		return kerr.Invalid("fires_total", "must be 0 or more, got %d", l.FiresTotal)
	}
	return validRef("pid", l.Pid)
}

// ValidRoute checks a route entry as the NameServer keeps and pushes it; the
// error names the entry's field ("owner.id"; a caller puts it under the list's
// with Under) and the limit. A route the NameServer pushes always passes: it
// comes back to it as hearsay.
func ValidRoute(r *messages.RouteEntry) *messages.Error {
	if r == nil {
		return kerr.Invalid("", "is required: the shard's name, owner and epoch")
	}
	sh, e := ValidShard("shard", r.Shard)
	if e != nil {
		return e
	}
	if r.App != sh.App {
		return kerr.Invalid("app", "is %s, the shard %s is of app %s", quoteShort(r.App), r.Shard, sh.App)
	}
	if int(r.Level) != sh.Level {
		return kerr.Invalid("level", "is %d, the shard %s is at level %d", r.Level, r.Shard, sh.Level)
	}
	if r.Index != sh.Index {
		return kerr.Invalid("index", "is %d, the shard %s is at index %d", r.Index, r.Shard, sh.Index)
	}
	if e := validRef("owner", r.Owner); e != nil {
		return e
	}
	if r.ServerId != "" { // "" in a handed-off shard's hearsay: its server is not known
		if e := validText("server_id", r.ServerId, MaxServerIDLen); e != nil {
			return e
		}
	}
	return validEpoch("epoch", r.Epoch, 0)
}

// ValidShard parses a shard's name, and says what makes it unfit: it must be
// canonical (what route.Shard.String makes: one name a shard, or one shard would
// get two routes, two journals' worth of records on one stream), of a valid app.
func ValidShard(field, name string) (route.Shard, *messages.Error) {
	if name == "" {
		return route.Shard{}, kerr.Invalid(field, "must not be empty: a shard's name is app/level/index (the limit is %d bytes)", MaxShardNameLen)
	}
	if len(name) > MaxShardNameLen {
		return route.Shard{}, kerr.Invalid(field, "is %d bytes, the limit is %d", len(name), MaxShardNameLen)
	}
	sh, err := route.Parse(name)
	if err != nil {
		return route.Shard{}, kerr.Invalid(field, "%v (app/level/index, the level 0 to %d)", err, route.MaxLevel)
	}
	if why := route.ValidApp(sh.App); why != "" {
		return route.Shard{}, kerr.Invalid(field, "%q: the app %s", name, why)
	}
	i := strings.LastIndexByte(name, '/') // Parse found app/level/index: the level is between the app and i
	if !canonicalNumber(name[len(sh.App)+1:i]) || !canonicalNumber(name[i+1:]) {
		return route.Shard{}, kerr.Invalid(field, "%q is not in canonical form (%s)", name, sh)
	}
	return sh, nil
}

// canonicalNumber says whether s is a number as strconv writes it: digits, no
// leading zero but in "0" (route.Parse also takes "+1", "-0" and "01").
func canonicalNumber(s string) bool {
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ValidRef checks a reference to an actor (see validRef).
func ValidRef(field string, r *messages.Ref) *messages.Error { return validRef(field, r) }

// validEpoch checks an epoch: min to MaxEpoch.
func validEpoch(field string, epoch, min int64) *messages.Error {
	if epoch < min || epoch > MaxEpoch {
		return kerr.Invalid(field, "must be %d to %d, got %d", min, int64(MaxEpoch), epoch)
	}
	return nil
}

// ValidEpoch checks the epoch of a shard to open or import: 1 to MaxEpoch.
func ValidEpoch(field string, epoch int64) *messages.Error { return validEpoch(field, epoch, 1) }

// quoteShort quotes s, cut to 64 bytes.
func quoteShort(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// validRef checks a reference to an actor the NameServer will send to: a nil or
// empty one would take a shard's dispatches (or a subscriber's pushes) nowhere.
func validRef(field string, r *messages.Ref) *messages.Error {
	if r == nil {
		return kerr.Invalid(field, "is required: the actor's address and id")
	}
	// (The fields' names are made only for an error: a heartbeat holds thousands.)
	if why := textFault(r.Address, MaxRefLen); why != "" {
		return kerr.Invalid(field+".address", "%s", why)
	}
	if why := textFault(r.Id, MaxRefLen); why != "" {
		return kerr.Invalid(field+".id", "%s", why)
	}
	return nil
}

// Under names e's field as one of prefix ("shards[3]" and "epoch" make
// "shards[3].epoch"): the checks of a list's elements name their own fields, and
// the element's name is made only for an error.
func Under(prefix string, e *messages.Error) *messages.Error {
	if e == nil {
		return nil
	}
	if e.Field == "" {
		e.Field = prefix
	} else {
		e.Field = prefix + "." + e.Field
	}
	return e
}

// validText checks a name (see textFault) and names field in its error.
func validText(field, s string, limit int) *messages.Error {
	if why := textFault(s, limit); why != "" {
		return kerr.Invalid(field, "%s", why)
	}
	return nil
}

// ValidWorkerID says what makes id unfit for a worker id, or "" (as route.ValidApp
// does for an app).
func ValidWorkerID(id string) string { return textFault(id, MaxWorkerIDLen) }

// textFault says what makes s unfit for a name of at most limit bytes, or "": empty,
// too long, not UTF-8 (protobuf does not marshal anything else, and proto.actor
// drops a message that does not marshal: a route push holding it would reach no
// server) or a control character.
func textFault(s string, limit int) string {
	if s == "" {
		return fmt.Sprintf("must not be empty (the limit is %d bytes)", limit)
	}
	if len(s) > limit {
		return fmt.Sprintf("is %d bytes, the limit is %d", len(s), limit)
	}
	return route.TextFault(s)
}

// errWorkersFull is the refusal of a new worker past MaxWorkers.
func errWorkersFull(n, limit int) *messages.Error {
	return kerr.New(messages.Code_RESOURCE_EXHAUSTED, "worker.worker_id",
		"the name server holds %d workers, the limit is %d; this one is not registered", n, limit)
}

// errSubscribersFull is the refusal of a new subscriber past MaxSubscribers.
func errSubscribersFull(n, limit int) *messages.Error {
	return kerr.New(messages.Code_RESOURCE_EXHAUSTED, "subscriber",
		"the name server has %d subscribers, the limit is %d", n, limit)
}

// The checks of what the NameServer and other servers send a server: orders
// (AssignShard, MoveShard), imports (ImportShard) and route tables. Each is
// refused, with the field at fault, before anything of it is kept or acted upon
// (a journal record written, a shard spawned or frozen, a table stored): what a
// server keeps comes back to the NameServer in its heartbeats, which refuses a
// heartbeat holding anything it would not keep itself (Check), so a
// server taking what the NameServer would refuse would go unheard for good.

// CheckAssign checks an assignment: the NameServer assigns only a new app's root
// shard, at epoch 1.
func CheckAssign(m *messages.AssignShard) *messages.Error {
	sh, e := ValidShard("shard", m.Shard)
	if e != nil {
		return e
	}
	if sh.Level != 0 {
		return kerr.Invalid("shard", "%s is not an app's root shard (level 0): only a new app's root is assigned", m.Shard)
	}
	return ValidEpoch("epoch", m.Epoch)
}

// CheckMove checks a move or split order: a target that is no actor would freeze
// the shard for good (its handoff is journaled, and retried after a restart).
func CheckMove(m *messages.MoveShard) *messages.Error {
	if _, e := ValidShard("shard", m.Shard); e != nil {
		return e
	}
	if e := ValidEpoch("epoch", m.Epoch); e != nil {
		return e
	}
	return ValidRef("target", m.Target)
}

// CheckImport checks an import's name and epoch (its snapshot is checked against
// them, loaded and checked again before it is persisted: importShard).
func CheckImport(m *messages.ImportShard) *messages.Error {
	if _, e := ValidShard("shard", m.Shard); e != nil {
		return e
	}
	return ValidEpoch("epoch", m.Epoch)
}

// CheckTable checks a route table pushed (or pulled) from the NameServer: its
// routes go back to the NameServer as hearsay, its workers to the shards.
func CheckTable(t *messages.RouteTable) *messages.Error {
	for i, r := range t.Routes {
		if e := ValidRoute(r); e != nil {
			return Under(fmt.Sprintf("routes[%d]", i), e)
		}
	}
	// (The fields' names are made only for an error: a table may list 65,536 workers.)
	for i, a := range t.Apps {
		if a == nil {
			return kerr.Invalid(fmt.Sprintf("apps[%d]", i), "is required: an app and its workers")
		}
		if why := route.ValidApp(a.App); why != "" {
			return kerr.Invalid(fmt.Sprintf("apps[%d].app", i), "%s", why)
		}
		for k, w := range a.Workers {
			if w == nil {
				return kerr.Invalid(fmt.Sprintf("apps[%d].workers[%d]", i, k), "is required: the worker's id, app, reference and capacity")
			}
			if e := ValidWorker(w); e != nil {
				return kerr.Invalid(fmt.Sprintf("apps[%d].workers[%d]", i, k)+strings.TrimPrefix(e.Field, "worker"), "%s", e.Message)
			}
		}
	}
	return nil
}
