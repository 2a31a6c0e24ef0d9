package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// HandedOnStore keeps, across restarts, the highest epoch each shard was handed
// on at from this server (the target's epoch). A handed-off shard's journal stream
// is dropped and compacted away, so without it a restarted server forgets that it
// ever held a shard; a source that was down during the handoff and comes back
// later resends its old import, and the route table (soft state: a fresh
// NameServer may not know the route yet) is then all that stands between that
// import and a second, stale owner. With it, movedOn answers such an import from
// disk.
type HandedOnStore interface {
	// Load returns the shards and epochs saved; an empty map when none are.
	Load() (map[string]int64, error)
	// Save replaces what is saved with m, durably, before it returns.
	Save(m map[string]int64) error
}

// HandedOnFile is a HandedOnStore in one JSON file, replaced atomically (a
// temporary file, fsync, rename, fsync of the directory). One entry per shard ever
// handed on from here: a few hundred bytes for a node's whole life in practice
// (split shards have bounded levels).
type HandedOnFile string

// Load reads the file; a missing file is an empty map, a corrupt one an error that
// names it.
func (f HandedOnFile) Load() (map[string]int64, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", string(f), err)
	}
	return m, nil
}

// Save writes m durably.
func (f HandedOnFile) Save(m map[string]int64) error {
	b, err := json.Marshal(m) // map keys come out sorted
	if err != nil {
		return err
	}
	return writeFileDurable(string(f), b)
}

// writeFileDurable replaces path with b atomically and durably: a temporary file,
// fsync, rename, fsync of the directory.
func writeFileDurable(path string, b []byte) error {
	tmp := path + ".tmp"
	w, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err = w.Write(b); err == nil {
		err = w.Sync()
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// NextIncarnation counts a start of the server on the data in dir: it reads the
// count kept in dir/incarnation, adds one and saves it durably before it returns
// it. Heartbeats carry it, so the NameServer can tell which of two member ids seen
// at one address is the process restarted since (a member id is random).
func NextIncarnation(dir string) (int64, error) {
	path := filepath.Join(dir, "incarnation")
	var n int64
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return 0, err
	default:
		if n, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil || n < 0 {
			return 0, fmt.Errorf("%s: not a count of starts: %q", path, b)
		}
	}
	n++
	if err := writeFileDurable(path, []byte(strconv.FormatInt(n, 10)+"\n")); err != nil {
		return 0, err
	}
	return n, nil
}
