package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis bounds.
const (
	redisStartTimeout   = 10 * time.Second
	redisRewriteTimeout = 60 * time.Second
	redisStopTimeout    = 5 * time.Second
)

// redisServer is the Redis the Asynq runs use: one this program started (and stops)
// or one given with --redis, which it never flushes.
type redisServer struct {
	addr    string
	version string
	owned   bool
	cmd     *exec.Cmd
	dir     string
	log     string
	rdb     *redis.Client
}

// ensureRedisBinary returns the path of redis-server, installing Debian's package
// when it is missing.
func ensureRedisBinary(logf func(string, ...any)) (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	logf("redis-server not found: apt-get install -y redis-server")
	install := func() error {
		c := exec.Command("apt-get", "install", "-y", "--no-install-recommends", "redis-server")
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := c.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get install redis-server: %w\n%s", err, lastLines(string(out), 10))
		}
		return nil
	}
	if err := install(); err != nil {
		logf("install failed, running apt-get update first")
		if out, uerr := exec.Command("apt-get", "update").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("apt-get update: %w\n%s", uerr, lastLines(string(out), 10))
		}
		if err := install(); err != nil {
			return "", err
		}
	}
	return exec.LookPath("redis-server")
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRedis starts redis-server on loopback, on a free port, with a temporary
// directory and otherwise its built-in defaults ("as it ships").
func startRedis(ctx context.Context, logf func(string, ...any)) (*redisServer, error) {
	bin, err := ensureRedisBinary(logf)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kjob-compare-redis-")
	if err != nil {
		return nil, err
	}
	s := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), owned: true, dir: dir, log: filepath.Join(dir, "redis.log")}
	s.cmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--dir", dir,
		"--logfile", s.log, "--daemonize", "no")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s.rdb = redis.NewClient(&redis.Options{Addr: s.addr})
	deadline := time.Now().Add(redisStartTimeout)
	for {
		if err := s.rdb.Ping(ctx).Err(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.stop()
			log, _ := os.ReadFile(s.log)
			return nil, fmt.Errorf("redis-server on %s did not answer within %s:\n%s", s.addr, redisStartTimeout, lastLines(string(log), 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.version = s.info(ctx, "server", "redis_version")
	return s, nil
}

// useRedis connects to a Redis someone else runs.
func useRedis(ctx context.Context, addr string) (*redisServer, error) {
	s := &redisServer{addr: addr, rdb: redis.NewClient(&redis.Options{Addr: addr})}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	s.version = s.info(ctx, "server", "redis_version")
	return s, nil
}

func (s *redisServer) info(ctx context.Context, section, key string) string {
	return s.infoFields(ctx, section)[key]
}

// infoFields is one INFO section, field by field (empty when Redis does not answer).
func (s *redisServer) infoFields(ctx context.Context, section string) map[string]string {
	txt, err := s.rdb.Info(ctx, section).Result()
	if err != nil {
		return nil
	}
	f := map[string]string{}
	for _, l := range strings.Split(txt, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = v
		}
	}
	return f
}

// reset empties the Redis between runs (only one this program owns).
func (s *redisServer) reset(ctx context.Context) error {
	if !s.owned {
		return nil
	}
	return s.rdb.FlushAll(ctx).Err()
}

// persistence describes the current durability settings.
func (s *redisServer) persistence(ctx context.Context) string {
	get := func(k string) string {
		m, err := s.rdb.ConfigGet(ctx, k).Result()
		if err != nil {
			return "?"
		}
		return m[k]
	}
	return fmt.Sprintf("appendonly %s, appendfsync %s, save %q", get("appendonly"), get("appendfsync"), get("save"))
}

// appendfsyncAlways switches on the AOF with an fsync before every reply, and
// waits for the initial rewrite to finish.
func (s *redisServer) appendfsyncAlways(ctx context.Context) error {
	if err := s.rdb.ConfigSet(ctx, "appendonly", "yes").Err(); err != nil {
		return err
	}
	if err := s.rdb.ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		return err
	}
	deadline := time.Now().Add(redisRewriteTimeout)
	for s.info(ctx, "persistence", "aof_rewrite_in_progress") != "0" || s.info(ctx, "persistence", "aof_rewrite_scheduled") != "0" {
		if time.Now().After(deadline) {
			return errors.New("redis: the AOF rewrite after appendonly yes did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// settle waits while Redis has a child at work: a background RDB save (the shipped
// save points start one after 10,000 changes in 60 s, as every create or fire run
// here makes) or an AOF rewrite (the AOF doubling past 64 MiB starts one). Such a
// child forks the dataset and writes it out, CPU and disk that the run after it
// would share; so each timed create, of either side, starts on a Redis at rest.
// (In the runs of 2026-12-07 the waits were 0–0.1 s: FLUSHALL ends a save in
// progress, and the saves finished quickly.) It reports how long it waited.
func (s *redisServer) settle(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(redisRewriteTimeout)
	for {
		p := s.infoFields(ctx, "persistence") // one INFO a poll
		if p["rdb_bgsave_in_progress"] != "1" && p["aof_rewrite_in_progress"] != "1" && p["aof_rewrite_scheduled"] != "1" {
			break
		}
		if time.Now().After(deadline) {
			return time.Since(t0), errors.New("redis: a background save or AOF rewrite did not finish")
		}
		select {
		case <-ctx.Done():
			return time.Since(t0), ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Since(t0), nil
}

// cpu is the CPU time redis-server has used, all its threads (the scheduler's
// per-thread run time, /proc/<pid>/task/*/schedstat); false for a Redis this
// program did not start.
func (s *redisServer) cpu() (time.Duration, bool) {
	if !s.owned || s.cmd == nil || s.cmd.Process == nil {
		return 0, false
	}
	dir := fmt.Sprintf("/proc/%d/task", s.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}

func (s *redisServer) stop() {
	if s.rdb != nil {
		s.rdb.Close()
	}
	if !s.owned || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(redisStopTimeout):
		_ = s.cmd.Process.Kill()
		<-done
	}
	os.RemoveAll(s.dir)
}
