package leakybucket

import (
	"context"
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
	defer b.observe(ctx, b.observed(), opFlush, resource, client, 0, nil, &err)
	if err := b.check(resource, client, 1); err != nil {
		return err
	}
	return b.counts.flush(ctx, resource, client)
}

// FlushAll forgets every count of resource, for all clients and rules.
// It deletes the keys in one command, so that a decision running at the
// same time is counted wholly before or wholly after it (under Logs, with
// a per-resource rule, it takes the resource's lock for that). When a rule
// is per-client it finds the clients' keys with SCAN, which walks the whole
// database.
func (b *Bucket) FlushAll(ctx context.Context, resource string) (err error) {
	defer b.observe(ctx, b.observed(), opFlushAll, resource, "", 0, nil, &err)
	if resource == "" {
		return ErrEmptyResource
	}
	return b.counts.flushAll(ctx, resource)
}
