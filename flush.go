package leakybucket

import (
	"context"

	"github.com/leakybucket/leakybucket/internal/lock"
)

// Flush forgets the counts of client at resource: its own, and its share of
// the resource's, and the denials this Bucket cached for it. A decision running at the same time is either forgotten
// with them or counted after the flush, never half of each. Under Logs it
// takes the lock as a decision does, and costs two round trips (when the
// SCAN fits in one page); SortedSet and Windows read, then write.
//
// Windows keeps no per-client counts when every rule is per-resource, so
// it cannot tell a client's share there: Flush then returns an error
// matching errors.ErrUnsupported (use FlushAll).
func (b *Bucket) Flush(ctx context.Context, resource, client string) (err error) {
	defer b.observe(ctx, b.observed(), OpFlush, resource, client, 0, nil, &err)
	if err := b.check(resource, client, 1); err != nil {
		return err
	}
	if b.local != nil {
		return b.local.flush(ctx, resource, client)
	}
	b.denials.forget(resource, &client)
	_, err = bounded(ctx, func(ctx context.Context, view *lock.View) (struct{}, error) {
		at, err := b.siteOf(ctx, resource, view)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, classify(b.route.redirected(b.store.flush(ctx, at, client)))
	})
	b.denials.forget(resource, &client) // one cached by a decision that raced the flush
	b.foresight.drop(resource, &client)
	return err
}

// FlushAll forgets every count of resource, for all clients and rules.
// It deletes the keys in one command, so that a decision running at the
// same time is counted wholly before or wholly after it (under Logs, with
// a per-resource rule, it takes the resource's lock for that). When a rule
// is per-client it finds the clients' keys with SCAN, which walks the whole
// database.
func (b *Bucket) FlushAll(ctx context.Context, resource string) (err error) {
	defer b.observe(ctx, b.observed(), OpFlushAll, resource, "", 0, nil, &err)
	if resource == "" {
		return ErrEmptyResource
	}
	if b.local != nil {
		return b.local.flushAll(ctx, resource)
	}
	b.denials.forget(resource, nil)
	_, err = bounded(ctx, func(ctx context.Context, view *lock.View) (struct{}, error) {
		at, err := b.siteOf(ctx, resource, view)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, classify(b.route.redirected(b.store.flushAll(ctx, at)))
	})
	b.denials.forget(resource, nil) // those cached by decisions that raced the flush
	b.foresight.drop(resource, nil)
	return err
}

// deleteUnder deletes every key under prefix, found with SCAN (keyScan),
// and then checks that the node still owns the slot (on a cluster, a SCAN
// of a node that lost it finds nothing).
func deleteUnder(ctx context.Context, at site, prefix string, count int) error {
	r := newKeyScan(prefix, count)
	if err := r.finish(ctx, at.node); err != nil {
		return err
	}
	if len(r.found) > 0 {
		if err := at.node.Del(ctx, r.found...).Err(); err != nil {
			return err
		}
	}
	return at.route.owns(ctx, at.node, at.keys)
}
