// Package route names shards and maps job ids to them. It is pure: the client, the
// NameServer and the shards all use it, so they agree on which shard owns a job.
//
// An app's jobs are spread over hash ranges of the 64-bit hash of the job id. A shard
// is "app/level/index": at level L there are 2^L ranges and shard i holds the hashes
// whose top L bits equal i. Splitting app/L/i makes app/(L+1)/(2i) and app/(L+1)/(2i+1).
package route

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLevel bounds splitting: 2^20 shards per app is far past any real need.
const MaxLevel = 20

// MaxAppLen bounds an app name.
const MaxAppLen = 64

// Hash mixes a job id into a uniformly spread 64-bit value (splitmix64 finalizer), so
// consecutive snowflake ids land in different ranges.
func Hash(id int64) uint64 {
	z := uint64(id) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// HashString hashes a string key (worker ids, routing keys) the same way.
func HashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return Hash(int64(h.Sum64()))
}

// Shard identifies one hash range of an app.
type Shard struct {
	App   string
	Level int
	Index int64
}

// Root is the single shard an app starts with.
func Root(app string) Shard { return Shard{App: app} }

func (s Shard) String() string { return fmt.Sprintf("%s/%d/%d", s.App, s.Level, s.Index) }

// Contains reports whether the job hash h falls in the shard's range.
func (s Shard) Contains(h uint64) bool {
	if s.Level == 0 {
		return true
	}
	return int64(h>>(64-uint(s.Level))) == s.Index
}

// ContainsJob reports whether job id falls in the shard's range.
func (s Shard) ContainsJob(id int64) bool { return s.Contains(Hash(id)) }

// Children returns the two halves of the shard's range.
func (s Shard) Children() (Shard, Shard) {
	return Shard{s.App, s.Level + 1, 2 * s.Index}, Shard{s.App, s.Level + 1, 2*s.Index + 1}
}

// Parent returns the shard this one was split from (the root returns itself).
func (s Shard) Parent() Shard {
	if s.Level == 0 {
		return s
	}
	return Shard{s.App, s.Level - 1, s.Index / 2}
}

// Stream is the journal stream id of the shard: a hash of its name.
func (s Shard) Stream() uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.String()))
	return h.Sum64()
}

// Parse parses "app/level/index".
func Parse(name string) (Shard, error) {
	i := strings.LastIndexByte(name, '/')
	if i <= 0 {
		return Shard{}, fmt.Errorf("route: bad shard name %q", name)
	}
	j := strings.LastIndexByte(name[:i], '/')
	if j <= 0 {
		return Shard{}, fmt.Errorf("route: bad shard name %q", name)
	}
	level, err := strconv.Atoi(name[j+1 : i])
	if err != nil || level < 0 || level > MaxLevel {
		return Shard{}, fmt.Errorf("route: bad shard level in %q", name)
	}
	index, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil || index < 0 || index >= int64(1)<<uint(level) {
		return Shard{}, fmt.Errorf("route: bad shard index in %q", name)
	}
	return Shard{App: name[:j], Level: level, Index: index}, nil
}

// ValidApp reports why an app name is unusable, or "" when it is fine. Names are
// 1..64 characters of letters, digits, '.', '_' and '-'.
func ValidApp(app string) string {
	if app == "" {
		return "must not be empty"
	}
	if len(app) > MaxAppLen {
		return fmt.Sprintf("is %d characters, the limit is %d", len(app), MaxAppLen)
	}
	for _, r := range app {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Sprintf("has %q; only letters, digits, '.', '_' and '-' are allowed", r)
		}
	}
	return ""
}

// TextFault says what makes s unfit for a name kjob keeps and sends (a handler, a
// route key, a worker id), or "": bytes that are not UTF-8 (protobuf does not
// marshal them, and proto.actor drops a message that does not marshal) or a control
// character.
func TextFault(s string) string {
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%q is not valid UTF-8", s)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Sprintf("has the control character %U at byte %d", r, i)
		}
	}
	return ""
}

// Lookup finds, among shards (all of one app), the one holding job id: the deepest
// shard whose range contains the hash. ok is false when none does.
func Lookup(shards []Shard, id int64) (Shard, bool) {
	h := Hash(id)
	best, ok := Shard{}, false
	for _, s := range shards {
		if s.Contains(h) && (!ok || s.Level > best.Level) {
			best, ok = s, true
		}
	}
	return best, ok
}
