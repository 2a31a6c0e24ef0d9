package cluster

import (
	"sort"

	"github.com/kjob/kjob/messages"
)

func sortJobs(js []*messages.Job) {
	sort.Slice(js, func(a, b int) bool { return js[a].Id < js[b].Id })
}
