package leakybucket

import (
	"cmp"
	"slices"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// tally is the calls a read of Logs found, under the lock (its logs),
// oldest first once sorted.
type tally struct {
	now  int64                 // Redis time, ms, read after the counts
	all  []logEntry            // the resource's entries: what per-resource rules count
	mine map[string][]logEntry // by encoded client: what per-client rules count
}

func newTally() tally { return tally{mine: map[string][]logEntry{}} }

// of returns the entries of client.
func (t *tally) of(client string) []logEntry { return t.mine[keys.Encode(client)] }

// add counts a call by client, the newest, as a read would show it after
// the call was recorded.
func (t *tally) add(client string, e logEntry) {
	t.all = append(t.all, e)
	t.mine[keys.Encode(client)] = append(t.mine[keys.Encode(client)], e)
}

// sort puts the entries oldest first: the order in which they leave every
// window.
func (t *tally) sort() {
	byTime := func(a, b logEntry) int { return cmp.Compare(a.at, b.at) }
	slices.SortFunc(t.all, byTime)
	for _, entries := range t.mine {
		slices.SortFunc(entries, byTime)
	}
}

// view is what each of rules counts for a call by client stamped at
// stamp, t sorted.
func (t *tally) view(rules []Rule, client string, stamp int64) view {
	v := view{now: t.now, counts: make([]count, len(rules))}
	for i, rule := range rules {
		entries := t.all
		if rule.Scope == ScopeClient {
			entries = t.of(client)
		}
		v.counts[i] = countOf(rule, entries, t.now)
		v.counts[i].stamp = stamp
	}
	return v
}
