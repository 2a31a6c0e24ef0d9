package sim

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	nscore "github.com/kjob/kjob/actors/nameserver/core"
	shardcore "github.com/kjob/kjob/actors/shard/core"
)

// Fault is a set of fault kinds the simulator may inject before it heals.
type Fault uint32

// Fault kinds. Each can be switched off on its own, so a failing seed can be
// narrowed down to the fault that matters.
const (
	FaultLoss        Fault = 1 << iota // messages dropped
	FaultDup                           // messages delivered twice
	FaultDelay                         // a long latency tail, so messages overtake each other
	FaultPartition                     // a set of nodes cut off from the rest, healed later
	FaultCrash                         // servers crash and restart
	FaultWorkerCrash                   // workers crash and restart (fresh memory, new id)
	FaultClientCrash                   // clients crash and restart (outstanding requests orphaned)
	FaultDisk                          // torn or garbled journal tails, failed and slow fsyncs
	FaultClock                         // clock skew per node and jumps
	FaultSlow                          // slow nodes: latency and disk and handlers
	FaultMove                          // extra MoveShard orders (moves, splits, moves straight back), as from a flapping balancer

	// AllFaults is every fault kind.
	AllFaults = FaultLoss | FaultDup | FaultDelay | FaultPartition | FaultCrash | FaultWorkerCrash |
		FaultClientCrash | FaultDisk | FaultClock | FaultSlow | FaultMove
)

var faultNames = []struct {
	name string
	f    Fault
}{
	{"loss", FaultLoss}, {"dup", FaultDup}, {"delay", FaultDelay}, {"partition", FaultPartition},
	{"crash", FaultCrash}, {"worker", FaultWorkerCrash}, {"client", FaultClientCrash},
	{"disk", FaultDisk}, {"clock", FaultClock}, {"slow", FaultSlow}, {"move", FaultMove},
}

// ParseFaults reads a comma-separated list of fault names ("loss,crash"), "all" or
// "none"; a name prefixed by '-' is removed ("all,-move").
func ParseFaults(s string) (Fault, error) {
	var f Fault
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(strings.ToLower(part))
		if part == "" {
			continue
		}
		neg := strings.HasPrefix(part, "-")
		part = strings.TrimPrefix(part, "-")
		var bit Fault
		switch part {
		case "all":
			bit = AllFaults
		case "none":
			bit = 0
			if !neg {
				f = 0
			}
		default:
			found := false
			for _, n := range faultNames {
				if n.name == part {
					bit, found = n.f, true
				}
			}
			if !found {
				return 0, fmt.Errorf("sim: unknown fault %q (want all, none or a list of %s)", part, faultList())
			}
		}
		if neg {
			f &^= bit
		} else {
			f |= bit
		}
	}
	return f, nil
}

func faultList() string {
	names := make([]string, len(faultNames))
	for i, n := range faultNames {
		names[i] = n.name
	}
	return strings.Join(names, ", ")
}

func (f Fault) String() string {
	if f == 0 {
		return "none"
	}
	if f == AllFaults {
		return "all"
	}
	var names []string
	for _, n := range faultNames {
		if f&n.f != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// Quirk is a set of behaviours of the code as it is today that the simulator found
// to be bugs (see the known-bugs list in doc.go). By default the simulated shells
// behave as the fix would; a quirk switches one back, to reproduce the bug.
type Quirk uint32

const (
	// QuirkEarlyOpen: the server reports a newly opened shard (ShardOpened and its
	// heartbeats) before the shard's SHARD_OPENED record is durable, as
	// actors/server does. A crash in that window loses the shard while the
	// NameServer keeps routing to it: the app is unavailable for good.
	QuirkEarlyOpen Quirk = 1 << iota
	// QuirkNoPull: servers never pull the route table, as actors/server and
	// cluster.Node do; DESIGN.md's "a pull every few seconds repairs a lost push"
	// is missing. A server that missed a push (lost, or sent while it was
	// partitioned, which the NameServer does not re-send when it hears from it
	// again) keeps stale routes and worker lists: its shards stop dispatching.
	QuirkNoPull
	// QuirkNoRequestIDs: clients send commands without a request id, as the Go client
	// did before shard cores had a request window: a retried or late command is
	// applied again (update-applied-twice, resurrected-by-late-create).
	QuirkNoRequestIDs
	// QuirkNoMembers: the NameServer is not told the configured servers, as before
	// cluster.StartNode passed its peers: it places a new root shard while the app's
	// owner is down (duplicate-placement).
	QuirkNoMembers
)

var quirkNames = []struct {
	name string
	q    Quirk
}{{"early-open", QuirkEarlyOpen}, {"no-pull", QuirkNoPull}, {"no-request-ids", QuirkNoRequestIDs}, {"no-members", QuirkNoMembers}}

// ParseQuirks reads a comma-separated list of quirk names ("" or "none": none).
func ParseQuirks(s string) (Quirk, error) {
	var q Quirk
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(strings.ToLower(part))
		if part == "" || part == "none" {
			continue
		}
		found := false
		for _, n := range quirkNames {
			if n.name == part {
				q |= n.q
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("sim: unknown quirk %q", part)
		}
	}
	return q, nil
}

func (q Quirk) String() string {
	var names []string
	for _, n := range quirkNames {
		if q&n.q != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParseMutation switches on one shard-core mutation by name: ack-before-durable,
// skip-epoch-check, fire-early[=ms] (default 1) or forget-retry-record.
func ParseMutation(s string, m *shardcore.Mutations) error {
	name, arg, hasArg := strings.Cut(strings.TrimSpace(strings.ToLower(s)), "=")
	switch name {
	case "ack-before-durable":
		m.AckBeforeDurable = true
	case "skip-epoch-check":
		m.SkipEpochCheck = true
	case "fire-early":
		m.FireEarlyMs = 1
		if hasArg {
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("sim: fire-early=%q: want a positive number of milliseconds", arg)
			}
			m.FireEarlyMs = n
		}
	case "forget-retry-record":
		m.ForgetRetryRecord = true
	case "refuse-all-no-room":
		m.RefuseAllNoRoom = true
	default:
		return fmt.Errorf("sim: unknown mutation %q (want ack-before-durable, skip-epoch-check, fire-early[=ms], forget-retry-record or refuse-all-no-room)", s)
	}
	return nil
}

// Defaults of a run.
const (
	DefaultDurationMs = 40_000
	DefaultTailLines  = 80
	// SettleMs is how long after the heal the cluster gets to recover (recoveries,
	// NameServer warm-up, route repair) before the liveness checks apply.
	SettleMs = 8_000
	// LateBoundMs bounds lateness once faults have stopped and the cluster settled:
	// a due run is dispatched, and a timer fires, within this many milliseconds.
	LateBoundMs = 100
	// OpBoundMs bounds a client operation's duration once the cluster settled.
	OpBoundMs = 10_000
	// QuietMs is the end of a run in which the NameServer's move and split orders
	// are not sent: the end-of-run checks see no shard frozen halfway through.
	QuietMs = 2_000
)

// Config describes one simulated run. The same Config gives the same run.
type Config struct {
	Seed uint64
	// Steps stops the run after this many events (0: run for DurationMs). A run cut
	// short skips the end-of-run liveness checks.
	Steps int64
	// DurationMs is the virtual length of the run (0: DefaultDurationMs).
	DurationMs int64
	// HealMs is when faults stop (0: 55% of DurationMs). From then on nodes come back,
	// partitions heal and the network and disks behave.
	HealMs int64
	// Faults that may be injected before HealMs.
	Faults Fault
	// Mutations are deliberate bugs switched on in every shard core (tests only).
	Mutations shardcore.Mutations
	// ArmMs is every shard core's Config.ArmMs (DefaultConfig: what a node uses).
	ArmMs int64
	// LazySyncMs is every shard core's Config.LazySyncMs (DefaultConfig: what a
	// node uses); the simulated journal lets such appends wait as the real one does.
	LazySyncMs int64
	// Batches: clients send some of their creates together, in CreateJobs
	// batches (plain or packed, lean replies or not), each create of a failed
	// batch then tried alone under its request id, as cluster.Client does.
	// DefaultConfig sets it; a run without it never draws for it.
	Batches bool
	// Snapshots: shards snapshot themselves every few records (when everything
	// they applied is durable, as the shard shell does), encoding the frozen view
	// at once or a little later while the core goes on; recovery starts each
	// stream from its newest snapshot and skips the records it covers, as
	// persistence.Journal.Replay after compaction. DefaultConfig sets it; a run
	// without it never draws for it.
	Snapshots bool
	// DiskFull: with FaultDisk, a server's disk is full now and then before
	// HealMs (up to two spells of 0.1–3 s each), and its shards refuse new work
	// meanwhile (shardcore.Roomy: creates, updates and triggers answered
	// RESOURCE_EXHAUSTED on field "journal"), as a node's journal down to its
	// reserve does. DefaultConfig sets it; its spells are drawn from a PRNG of
	// their own, so a run without it draws the same as before it.
	DiskFull bool
	// Quirks switch the simulated shells back to known-buggy behaviour.
	Quirks Quirk
	// Trace, when set, receives every trace line as it is written.
	Trace io.Writer
	// TailLines is how many trace lines a failure report carries (0: DefaultTailLines).
	TailLines int
	// CheckBalance adds the balance check once settled: a move the NameServer's
	// strategy wants must be done within BalanceBoundMs. It is meant for runs
	// with room for moves after the heal (BalanceRunMs), so the default sweep
	// leaves it off.
	CheckBalance bool
}

// BalanceRunMs and BalanceHealMs shape a run for CheckBalance: faults for the
// first 20 s, then 100 s without, room for several moves and their cooldowns.
const (
	BalanceRunMs  = 120_000
	BalanceHealMs = 20_000
	// BalanceBoundMs is how long a wanted move may stay undone: the move
	// cooldown, a split in between (SplitCooldownMs), a handoff and heartbeats.
	BalanceBoundMs = nscore.MoveCooldownMs + 2*nscore.SplitCooldownMs + 5_000
)

// DefaultConfig is the configuration of `kjob sim --seed seed`: every fault kind.
func DefaultConfig(seed uint64) Config {
	return Config{Seed: seed, Faults: AllFaults, ArmMs: shardcore.DefaultArmMs, LazySyncMs: shardcore.DefaultLazySyncMs, Batches: true, Snapshots: true, DiskFull: true}
}

func (c *Config) defaults() {
	if c.DurationMs <= 0 {
		c.DurationMs = DefaultDurationMs
	}
	if c.HealMs <= 0 || c.HealMs > c.DurationMs {
		c.HealMs = c.DurationMs * 55 / 100
	}
	if c.TailLines <= 0 {
		c.TailLines = DefaultTailLines
	}
}

// ReplayCommand is the command line that replays this configuration exactly.
func (c Config) ReplayCommand() string {
	cmd := fmt.Sprintf("kjob sim --seed %d --faults %s", c.Seed, c.Faults)
	if c.DurationMs != 0 && c.DurationMs != DefaultDurationMs {
		cmd += fmt.Sprintf(" --duration %dms", c.DurationMs)
	}
	if c.HealMs != 0 && c.HealMs != c.DurationMs*55/100 {
		cmd += fmt.Sprintf(" --heal %dms", c.HealMs)
	}
	if c.Quirks != 0 {
		cmd += " --quirks " + c.Quirks.String()
	}
	if c.CheckBalance {
		cmd += " --check-balance"
	}
	if c.ArmMs != shardcore.DefaultArmMs {
		cmd += fmt.Sprintf(" --arm-ms %d", c.ArmMs)
	}
	if c.LazySyncMs != shardcore.DefaultLazySyncMs {
		cmd += fmt.Sprintf(" --lazy-sync-ms %d", c.LazySyncMs)
	}
	if !c.Batches {
		cmd += " --batches=false"
	}
	if !c.Snapshots {
		cmd += " --snapshots=false"
	}
	if !c.DiskFull {
		cmd += " --disk-full=false"
	}
	m := c.Mutations
	if m.AckBeforeDurable {
		cmd += " --mutate ack-before-durable"
	}
	if m.SkipEpochCheck {
		cmd += " --mutate skip-epoch-check"
	}
	if m.FireEarlyMs != 0 {
		cmd += fmt.Sprintf(" --mutate fire-early=%d", m.FireEarlyMs)
	}
	if m.ForgetRetryRecord {
		cmd += " --mutate forget-retry-record"
	}
	if m.RefuseAllNoRoom {
		cmd += " --mutate refuse-all-no-room"
	}
	return cmd
}

// Failure is a broken invariant: which one, why, and where in the run.
type Failure struct {
	Invariant string // short name, e.g. "acked-job-lost"
	Message   string
	Seed      uint64
	Step      int64 // the event during which it was detected
	AtMs      int64 // virtual time (sim clock) of that event
	Replay    string
	Final     bool     // found by the end-of-run checks (replay the whole run)
	Tail      []string // the last trace lines, oldest first
}

// ReplayCommand is the command line that reproduces the failure.
func (f *Failure) ReplayCommand() string {
	if f.Final {
		return f.Replay + " --trace"
	}
	return fmt.Sprintf("%s --steps %d --trace", f.Replay, f.Step)
}

func (f *Failure) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sim: seed %d: invariant %s broken at step %d (t=%d ms): %s\n", f.Seed, f.Invariant, f.Step, f.AtMs, f.Message)
	fmt.Fprintf(&b, "replay: %s\n", f.ReplayCommand())
	fmt.Fprintf(&b, "last %d trace lines:\n", len(f.Tail))
	for _, l := range f.Tail {
		b.WriteString("  ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// Stats are counts from one run, for reports and for judging a sweep's coverage.
type Stats struct {
	Events, Messages, Dropped, Duplicated            int64
	ServerCrashes, WorkerCrashes, ClientCrashes      int64
	TornTails, FsyncFailures, Partitions, ClockJumps int64
	// Moves are handoffs begun (MoveShard taken by a shard core, splits included);
	// MoveOrders those the NameServer decided (the rest: the move fault);
	// MovesDone handoffs completed (closed at the source), SplitsDone the splits
	// among them; Imports shards activated by an import (a split makes two).
	Moves, MoveOrders, MovesDone, SplitsDone, Imports int64
	Ops, OpsAcked, OpsGaveUp                          int64
	// Batches are CreateJobs the clients sent (Config.Batches), BatchedCreates the
	// creates they carried, BatchFallbacks the creates then tried alone.
	Batches, BatchedCreates, BatchFallbacks int64
	Creates, Deletes                        int64
	Fires, Executions, Retries, DeadLetters int64
	Recoveries, RecordsReplayed             int64
	// Snapshots are shard snapshots written (Config.Snapshots), SnapshotsLoaded
	// those a recovery began a shard from.
	Snapshots, SnapshotsLoaded int64
	ChecksRun                  int64
	StaleResults               int64 // results delivered to a shard at another epoch
	NoRoomRefusals             int64 // calls answered RESOURCE_EXHAUSTED by a shard on a full disk (Config.DiskFull)
	RetriesExact               int64 // retries checked to the millisecond against the ladder
	MaxLateMs                  int64 // largest fire lateness once settled
}

// Result is the outcome of one run.
type Result struct {
	Seed    uint64
	Steps   int64  // events processed
	EndMs   int64  // virtual time reached
	Hash    uint64 // FNV-64a of the whole trace: equal seeds give equal hashes
	Failure *Failure
	Known   []*Failure // known open bugs met on the way (the run went on)
	Stats   Stats
	Shape   string // cluster shape chosen by the seed, e.g. "3 servers, 2 apps, 3 workers, 2 clients"
}
