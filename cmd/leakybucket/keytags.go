package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A Bucket's keys are named <prefix>:<tag>:{<resource>}..., where the tag
// names its strategy's layout (the longest window, and the precisions
// under windows). A command given another strategy or other rules than
// the service's Bucket reads keys that do not exist, and would print
// 0/100 as if nothing had been counted: so peek and flush look for the
// tags under the prefix, and warn when theirs is not among them.

// keyBases is a go-redis hook that keeps the "<prefix>:<tag>" part of the
// keys (or SCAN patterns) the Bucket's commands name.
type keyBases struct {
	prefix string

	mu    sync.Mutex
	bases map[string]bool
}

func (k *keyBases) add(cmds ...redis.Cmder) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, cmd := range cmds {
		for _, arg := range cmd.Args() {
			if base, ok := k.baseOf(fmt.Sprint(arg)); ok {
				if k.bases == nil {
					k.bases = map[string]bool{}
				}
				k.bases[base] = true
			}
		}
	}
}

// baseOf returns the tag of key, if it is a key of the prefix.
func (k *keyBases) baseOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if !ok {
		return "", false
	}
	tag, _, ok := strings.Cut(rest, ":{")
	return tag, ok && tag != "" && !strings.ContainsAny(tag, "*?[")
}

// tags returns the tags seen.
func (k *keyBases) tags() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.bases))
}

func (k *keyBases) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k *keyBases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		k.add(cmd)
		return next(ctx, cmd)
	}
}

func (k *keyBases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		k.add(cmds...)
		return next(ctx, cmds)
	}
}

// maxTagPages bounds the SCAN calls that look for tags: 100 pages of
// COUNT 1000, a walk of 100 000 keys per node.
const maxTagPages = 100

// warnIfNoKey warns on stderr when keys exist under the prefix but none
// carries the tag of the Bucket's keys, listing the tags found.
func (s *session) warnIfNoKey(ctx context.Context) error {
	own := s.seen.tags()
	found, complete, err := s.tagsUnderPrefix(ctx)
	if err != nil || len(found) == 0 || len(own) == 0 {
		return err // nothing under the prefix: a fresh resource, or flushed
	}
	for _, tag := range own {
		if found[tag] > 0 {
			return nil
		}
	}
	var list []string
	for _, tag := range slices.Sorted(maps.Keys(found)) {
		list = append(list, fmt.Sprintf("%s (%d keys)", tag, found[tag]))
	}
	partial := ""
	if !complete {
		partial = fmt.Sprintf(" (in the first %d pages of SCAN)", maxTagPages)
	}
	_, err = fmt.Fprintf(s.stderr, "leakybucket: warning: no key under %q carries this Bucket's tag %s: it counted nothing with -strategy %s and these rules. Keys under the prefix carry the tags%s: %s. A tag is w<longest window in ms>, and under windows each precision; give the service's exact -strategy and rules.\n",
		s.seen.prefix, strings.Join(own, ", "), s.g.strategy.text, partial, strings.Join(list, ", "))
	return err
}

// tagsUnderPrefix counts the keys under the prefix by tag, on every master;
// complete is false if it stopped after maxTagPages pages of a node.
func (s *session) tagsUnderPrefix(ctx context.Context) (map[string]int, bool, error) {
	nodes, err := masters(ctx, s.rdb)
	if err != nil {
		return nil, false, err
	}
	found, complete := map[string]int{}, true
	for _, node := range nodes {
		var cursor uint64
		for page := 0; page == 0 || cursor != 0; page++ {
			if page == maxTagPages {
				complete = false
				break
			}
			var keys []string
			if keys, cursor, err = node.Scan(ctx, cursor, s.seen.prefix+"*", 1000).Result(); err != nil {
				return nil, false, err
			}
			for _, key := range keys {
				if tag, ok := s.seen.baseOf(key); ok {
					found[tag]++
				}
			}
		}
	}
	return found, complete, nil
}
