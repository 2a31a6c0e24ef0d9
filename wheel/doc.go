// Package wheel is a passive hierarchical timing wheel: it keeps millions of
// pending one-shot timers, each a due time in milliseconds and a uint64
// payload, and hands them back in due order when the caller advances its
// clock. It has no goroutines and no clock of its own: the caller passes the
// time in (New, Advance) and keeps one runtime timer set to NextDue. That
// makes it deterministic, so the simulator drives the same code as a shard.
//
// # Structure
//
// A due time is mapped onto an unsigned 64-bit key (the int64 with its sign
// bit flipped, so order is kept and negative times work). The key is cut
// into digits, one per level:
//
//	level  key bits  slots  slot width   the level spans
//	0      0-5          64  1 ms         64 ms
//	1      6-17       4096  64 ms        4.4 min
//	2      18-23        64  4.4 min      4.7 h
//	3      24-29        64  4.7 h        12.4 days
//	4      30-35        64  12.4 days    2.2 years
//	5-9    36-63        64  ...          the rest of int64
//
// Relative to the wheel's position (elapsed), an entry sits at the level of
// the highest digit in which its key differs from elapsed, in the slot named
// by that digit. So all entries of a level lie within elapsed's current slot
// of the level above, the lowest occupied level holds the earliest entries,
// and its lowest occupied slot is the next one to process. An occupancy
// bitmap per level (and a summary word over level 1's 64 words) and a
// bitmap of non-empty levels find that slot in a few trailing-zero counts,
// however much idle time lies between. Every int64 has a slot: the horizon
// is unbounded, and the top levels are the overflow area, cascading down as
// the clock reaches them. Level 1 is wide so that a timer due within a
// minute or so is moved (cascaded) at most once before it fires, wherever
// the minute falls.
//
// Advance repeatedly takes that slot while it starts at or before the new
// time: a level-0 slot holds exactly one due time and fires in insertion
// order; a higher slot is cascaded, its entries re-inserted, in order, one
// level or more further down, relative to the slot's start. The levels below
// are empty at that moment, so the insertion order of equal due times,
// which every insertion establishes by appending, survives cascading.
// Entries whose due time is not after the clock when they are added wait in
// an overdue list, which the next Advance sorts stably by due time and
// fires before the slots.
//
// # Memory layout
//
// Entries live in a slab: chunks of 1024 fixed 16-byte structs (due,
// generation, position) with no pointers, so the garbage collector never
// scans them, and chunks never move, so the slab grows without copying. A
// slot is an array of 16-byte elements in insertion order, each the entry's
// slab index, the low 32 bits of its key and its payload; the entry records
// its position in that array, so Cancel and Reschedule find their element
// in O(1) and leave a tombstone (the newest element is simply dropped). A
// slot whose tombstones outnumber its live elements is compacted. The array
// is kept in blocks of 4096 elements past its first 4096 (elems.go), so a
// slot of millions (a campaign due at one time) grows without copying: a
// single copy of such an array into fresh memory held one Add for 70 ms. The kept
// key bits let a cascade place elements, and NextDue find a slot's minimum,
// without reading the entries, which lie at random places in the slab.
//
// Firing a level-0 slot does not read or write the entries either: the
// slot's due time and each element's payload are all fn needs. A fired
// entry is left as it was and its index is put on a list of spent entries;
// it is recognisable as fired because a pending entry's key is after the
// wheel's position (or, in the slot being fired, after the slot's head).
// Add takes an index from that list first, then from a free list of
// cancelled entries, and only then grows the slab. A Handle is the slab
// index plus the entry's generation, which is bumped when the entry is
// cancelled, or reused after it fired: a stale handle is recognised and
// never touches another entry. One random access to the slab per timer
// was most of what firing cost; it is now paid only by the Add that reuses
// the entry, which writes it anyway.
//
// A cascade from level 1 to level 0, the one nearly every timer goes
// through, does not touch the entries either (storing each one's new
// position would be a second random access per timer, besides firing it).
// The entries keep their level-1 positions, and the wheel keeps one array,
// indexed by level-1 position, of the positions the cascade gave them in
// level 0. Such a cascade only runs when level 0 is empty, so the level-0
// entries that do not hold their own position all came from the latest
// one, and the array has their positions. An entry holds its own position
// exactly when its slot's element there is its own: a lookup in level 0
// checks that first and otherwise takes the array's. Compacting a slot
// stores the exact positions again.
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
// Add, Cancel, Reschedule, Get, Len and Now are O(1) (amortized: a growth
// of a slot's first block, at most 4096 elements, or a compaction is linear
// in one slot, paid for by the insertions or cancellations that made it
// necessary). NextDue is O(1),
// plus one scan of one slot's elements when that slot's cached minimum was
// cancelled or moved since it was last computed. Advance costs O(1) per
// occupied slot it reaches and per entry it fires, plus O(1) per cascade of
// an entry; an entry is cascaded at most once per level below the one it
// was inserted at (at most once for a due time within a few minutes, four
// times for one within two years). Firing from a level-0 slot and a
// cascade from level 1 touch no entry; one from levels 2-4 writes the
// entry's position, one from above also reads its due time. Entries due
// at or before the clock when added (the overdue batch) are read to be
// sorted. Idle time costs nothing. Each is O(slab size), and Get reads the
// entry's element as well as the entry.
//
// # Memory
//
// 16 bytes per entry in the slab, plus 16 bytes per element in the slot
// arrays (and their growth slack: about a quarter within a slot's first
// 4096 elements, at most a block and a spare block of 64 KiB past them):
// about 33 bytes per pending timer. The slab
// never shrinks: its size is the largest number of entries ever pending,
// and the list of spent entries holds 4 bytes for each entry fired and not
// reused yet (given back once it empties, if it grew past 16 KiB).
// Slot arrays follow the pending entries: a slot emptied by firing or
// cascading gives a large array back. Fixed state is about 5.5 KiB per wheel
// (a shard has three, and a node may host thousands of shards), plus the
// slab's first 16 KiB chunk at the first entry, plus the pages of level 1
// (up to 256 KiB) and of each level above (4 KiB), allocated 4 KiB (64
// slots) at a time as they are used, plus the level-1 cascade's position array: 4 bytes per
// element of the level-1 slot cascaded last, kept up to 16 KiB, and given
// back once level 0 is empty if larger.
//
// # Limits
//
//   - At most 2^29 entries pending at once (slot positions are 30 bits);
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
