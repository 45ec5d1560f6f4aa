package main

import (
	"context"
	"io"
	"strings"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// client returns the client of -redis, or of the -cluster nodes with the
// user, password and TLS of -redis. Making it sends nothing to Redis.
func (g *globals) client() (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(g.redisURL)
	if err != nil {
		return nil, usagef("-redis: %v", err)
	}
	if g.cluster == "" {
		return redis.NewClient(opt), nil
	}
	addrs := splitAddrs(g.cluster)
	switch {
	case len(addrs) == 0:
		return nil, usagef("-cluster %q: no host:port", g.cluster)
	case opt.DB != 0:
		return nil, usagef("-cluster: a Redis Cluster has database 0 only, but -redis names database %d", opt.DB)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:     addrs,
		Username:  opt.Username,
		Password:  opt.Password,
		TLSConfig: opt.TLSConfig,
	}), nil
}

// splitAddrs splits a comma-separated list, dropping blanks.
func splitAddrs(list string) []string {
	var addrs []string
	for a := range strings.SplitSeq(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// A session is what a subcommand runs with: the flags, the client and the
// Bucket they describe.
type session struct {
	g      *globals
	rdb    redis.UniversalClient
	bucket *leakybucket.Bucket
	stderr io.Writer // for warnings
	seen   *keyBases // the key bases the Bucket's commands named
}

// open returns the session of the flags, with the Bucket of the rules if
// withBucket; close its client when done. It sends nothing to Redis: New
// only checks the options.
func (g *globals) open(withBucket bool) (*session, error) {
	switch {
	case withBucket && len(g.rules) == 0:
		return nil, usagef("no rule: give the Bucket's rules with -resource-limit and -client-limit")
	case g.timeout <= 0:
		return nil, usagef("-timeout %v: want a positive duration", g.timeout)
	}
	rdb, err := g.client()
	if err != nil {
		return nil, err
	}
	s := &session{g: g, rdb: rdb, seen: &keyBases{prefix: g.prefix + ":"}}
	rdb.AddHook(s.seen)
	if !withBucket {
		return s, nil
	}
	if s.bucket, err = s.newBucket(g.rules); err != nil {
		rdb.Close()
		return nil, err
	}
	return s, nil
}

// newBucket returns a Bucket of the flags but with the given rules, on the
// session's client.
func (s *session) newBucket(rules []leakybucket.Rule) (*leakybucket.Bucket, error) {
	return leakybucket.New(s.rdb, s.g.options(rules)...)
}

// quietLogger drops go-redis's own log lines (one per failed dial, say):
// the command prints the error that a call returns instead.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
