// Package wheel is a passive hierarchical timing wheel: it keeps millions of
// pending one-shot timers, each a due time in milliseconds and a uint64
// payload, and hands them back in due order when the caller advances its
// clock. It has no goroutines and no clock of its own: the caller passes the
// time in (New, Advance) and keeps one runtime timer set to NextDue. That
// makes it deterministic, so the simulator drives the same code as a shard.
//
// # Structure
//
// Time is mapped onto an unsigned 64-bit key (the int64 with its sign bit
// flipped, so order is kept and negative times work). The key is cut into
// 6-bit digits; level L has 64 slots, one per value of digit L, so a level-0
// slot spans 1 ms, a level-1 slot 64 ms, a level-2 slot 4.1 s, level 3
// 4.4 min, level 4 4.7 h, level 5 12.4 days, level 6 2.2 years, and so on:
// eleven levels cover every int64, so the horizon is unbounded and the top
// levels act as the overflow area. Relative to the wheel's position
// (elapsed), an entry sits at the level of the highest digit in which its
// due time differs from elapsed, in the slot named by that digit. Hence all
// entries of a level lie within elapsed's current slot of the level above,
// the lowest occupied level holds the earliest entries, and its lowest
// occupied slot is the next one to process. A 64-bit occupancy bitmap per
// level and a bitmap of non-empty levels find it with two trailing-zero
// counts, however much idle time lies between.
//
// Advance repeatedly takes that slot while it starts at or before the new
// time: a level-0 slot holds exactly one due time and fires in FIFO order; a
// higher slot is cascaded, each of its entries re-inserted (in list order)
// at a lower level relative to the slot's start. The levels below are empty
// at that moment, so order among equal due times, which every insertion
// establishes by appending, survives cascading. Entries whose due time is
// not after the clock when they are added wait on an overdue list, which
// the next Advance sorts stably by due time and fires before the slots.
//
// Entries live in a slab: chunks of 1024 fixed 32-byte structs with int32
// links and no pointers, so the garbage collector never scans them, chunks
// never move (no copying as the slab grows), and freed entries are reused
// through a free list. Each list is doubly linked through the slab, with
// its head stored in the slab too. A Handle is the slab index plus the
// slot's generation, which is bumped whenever the entry fires or is
// cancelled: a stale handle is recognised and never touches another entry.
//
// # Order and timing guarantees
//
//   - Advance(now) fires exactly the entries that were pending when it was
//     called and have due <= now (minus those its fn cancels or moves first),
//     in non-decreasing due order, ties in insertion order, where Reschedule
//     counts as a fresh insertion. Nothing with due > now ever fires.
//   - An entry added, or rescheduled, with a due time at or before the
//     clock fires at the next Advance (even Advance with the same time). This
//     holds inside Advance's fn too, where "the clock" is the time being
//     advanced to: such an entry waits for the next call, so a callback that
//     re-arms with a zero delay cannot make Advance loop forever.
//   - NextDue is exact (not rounded to a slot), so one runtime timer set to
//     it never wakes early and never needlessly.
//
// # Complexity
//
// Add, Cancel, Reschedule, Get, Len and Now are O(1). NextDue is O(1) plus,
// at most, one scan of one slot, only when the cached minimum of that slot
// was cancelled or moved since it was last computed. Advance costs O(1) per
// occupied slot it reaches and per entry it fires, plus one re-insertion per
// cascade of an entry; an entry cascades at most once per level below the
// one it was inserted at (twice for a due time within a minute, six times for
// one years away). Idle time costs nothing. Each is O(slab size).
//
// # Memory
//
// 32 bytes per entry in the slab, which never shrinks: its size is the
// largest number of entries ever pending (rounded up to 1024), plus about
// 30 KiB of fixed state per wheel (list heads, bitmaps, minimum caches).
//
// # Limits
//
//   - At most 2^31 - 707 entries pending at once (int32 slab indices);
//     Add panics beyond.
//   - A generation counter is 32 bits: a handle goes stale for good unless
//     the same slab slot is reused 2^32 times while it is still held.
//   - The clock only moves forward; Advance with an earlier time is a no-op.
//     Milliseconds are the only resolution.
//   - Not safe for concurrent use: the owner (one actor) serialises calls.
//   - fn must not call Advance (it panics). If fn panics, the wheel stays
//     consistent: the clock stops at the due time being fired and the
//     entries that had not fired fire at the next Advance.
//   - An entry is fired at most once; the wheel keeps nothing durable. The
//     owner journals what it needs and rebuilds the wheel with Add, using
//     Each to snapshot.
package wheel
