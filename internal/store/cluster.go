package store

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// On a Redis Cluster a Bucket runs each decision on the *redis.Client of the
// master that owns the resource's slot, as the ClusterClient's slot map says
// (MasterForKey), and not through the ClusterClient, because the lock needs
// one connection. That client follows no redirect, and the ClusterClient
// refreshes its map only when its own commands are redirected, or every
// ClusterStateReloadInterval (a minute by default). So after a slot moves to
// another master (resharding, failover), the old owner answers MOVED to
// every keyed command until the map is refreshed, and answers SCAN and TIME,
// which carry no key, from a database that no longer holds the slot's keys.
//
// ClusterRoute closes both gaps:
//
//   - redirected asks the ClusterClient to reload its map when a call was
//     answered MOVED, so that later calls go to the new owner within a
//     round trip or so. The call itself returns the error: nothing was
//     written (a MOVED command is not run, and a MOVED or ASK inside
//     MULTI aborts the EXEC), so the caller may retry it.
//   - conn adds EXISTS on a key of the resource's slot to every pipeline of
//     reads that would otherwise carry no key (a Logs Peek's SCAN and
//     TIME), and owns checks the slot after a FlushAll that found its keys
//     with SCAN. On a master that does not own the slot they fail with
//     MOVED, and with ASK while the slot is being migrated away, where part
//     of the keys are already on the target; so those reads fail rather
//     than answer from missing keys.
//
// A SortedSet or Windows decision needs neither guard: it is one MULTI/EXEC
// of keyed commands, which a MOVED or ASK on any of them aborts (EXECABORT;
// the error returned is the command's own MOVED or ASK). A Logs decision
// under the lock needs neither either: its first round trip sends
// SET NX on the lock key, and its write is a MULTI/EXEC fenced by WATCH on
// that key, which a MIGRATE of the key, or a MOVED or ASK on any queued
// command (a new key in a slot being migrated is refused with ASK), aborts.
// So a decision during a migration either completes on the slot's owner or
// writes nothing and returns an error; it never counts from half the keys.
//
// A nil *ClusterRoute (any other client) does nothing.
type ClusterRoute struct {
	cc *redis.ClusterClient
}

// RouteOf returns the route of rdb: nil unless it is a cluster client.
func RouteOf(rdb redis.UniversalClient) *ClusterRoute {
	if cc, ok := rdb.(*redis.ClusterClient); ok && cc != nil {
		return &ClusterRoute{cc: cc}
	}
	return nil
}

// Redirected returns err, after asking the cluster client to reload its slot
// map (in the background) if err is a MOVED redirect. An ASK needs no
// reload: the slot is being migrated and its owner has not changed yet.
func (c *ClusterRoute) Redirected(err error) error {
	if c == nil || err == nil {
		return err
	}
	if _, moved := redis.IsMovedError(err); moved {
		c.cc.ReloadState(context.Background())
	}
	return err
}

// conn returns node as the connection of a read of keys' resource: on a
// cluster, one whose every pipeline also checks that node owns the slot.
func (c *ClusterRoute) conn(node *redis.Client, ks keys.Space) pipeliner {
	if c == nil {
		return node
	}
	return slotGuarded{node: node, key: ks.Slot()}
}

// owns returns nil if node owns keys' slot, and is not migrating it away;
// else the MOVED or ASK error (or the error of the round trip).
func (c *ClusterRoute) owns(ctx context.Context, node *redis.Client, ks keys.Space) error {
	if c == nil {
		return nil
	}
	return node.Exists(ctx, ks.Slot()).Err()
}

// slotGuarded is a node whose every pipeline starts with EXISTS key. If that
// fails, every command of the pipeline reports its error.
type slotGuarded struct {
	node *redis.Client
	key  string // a key in the slot, held or not
}

func (g slotGuarded) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	var guard *redis.IntCmd
	cmds, err := g.node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		guard = pipe.Exists(ctx, g.key)
		return fn(pipe)
	})
	if guard != nil && guard.Err() != nil {
		err = guard.Err()
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
	}
	return cmds, err
}
