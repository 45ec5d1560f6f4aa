package store

import (
	"cmp"
	"slices"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// tally is the calls a read of Logs found, under the lock (its logs),
// oldest first once sorted.
type tally struct {
	now  int64                     // Redis time, ms, read after the counts
	all  []limits.Entry            // the resource's entries: what per-resource rules count
	mine map[string][]limits.Entry // by encoded client: what per-client rules count
}

func newTally() tally { return tally{mine: map[string][]limits.Entry{}} }

// of returns the entries of client.
func (t *tally) of(client string) []limits.Entry { return t.mine[keys.Encode(client)] }

// add counts a call by client, the newest, as a read would show it after
// the call was recorded.
func (t *tally) add(client string, e limits.Entry) {
	t.all = append(t.all, e)
	t.mine[keys.Encode(client)] = append(t.mine[keys.Encode(client)], e)
}

// sort puts the entries oldest first: the order in which they leave every
// window.
func (t *tally) sort() {
	byTime := func(a, b limits.Entry) int { return cmp.Compare(a.At, b.At) }
	slices.SortFunc(t.all, byTime)
	for _, entries := range t.mine {
		slices.SortFunc(entries, byTime)
	}
}

// view is what each of rules counts for a call by client stamped at
// stamp, t sorted.
func (t *tally) view(rules []limits.Rule, client string, stamp int64) limits.View {
	v := limits.View{Now: t.now, Counts: make([]limits.Count, len(rules))}
	for i, rule := range rules {
		entries := t.all
		if rule.PerClient {
			entries = t.of(client)
		}
		v.Counts[i] = rule.CountOf(entries, t.now)
		v.Counts[i].Stamp = stamp
	}
	return v
}
