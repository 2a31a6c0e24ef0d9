package route

import "github.com/kjob/kjob/messages"

// Group returns the workers of shard s among all the app's workers, given the app's
// shards: those whose id hashes into s's range (deepest shard wins), or all when none.
func Group(s Shard, shards []Shard, all []*messages.WorkerInfo) []*messages.WorkerInfo {
	if len(shards) <= 1 {
		return all
	}
	var g []*messages.WorkerInfo
	for _, w := range all {
		h := HashString(w.WorkerId)
		var best Shard
		found := false
		for _, o := range shards {
			if o.Contains(h) && (!found || o.Level > best.Level) {
				best, found = o, true
			}
		}
		if found && best == s {
			g = append(g, w)
		}
	}
	if len(g) == 0 {
		return all
	}
	return g
}
