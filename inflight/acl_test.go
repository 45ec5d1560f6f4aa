package inflight

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/acl"
)

// TestACLLeastPrivilege runs a Limiter's every method as an ACL user
// allowed only Commands (and what a connection needs), on the real Redis
// and on every master of the real cluster, and fails on any refusal,
// returned or logged in ACL LOG.
func TestACLLeastPrivilege(t *testing.T) {
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			v := redisAddrVar
			if kind == "cluster" {
				v = clusterAddrsVar
			}
			addrs := strings.Split(needAddr(t, v), ",")
			pfx := uniquePrefix()
			user, pass := pfx+"-user", pfx+"-pw"
			ctx := context.Background()
			for _, a := range addrs {
				admin := redis.NewClient(&redis.Options{Addr: a})
				defer admin.Close()
				if err := setACLUser(ctx, admin, user, pass, pfx, kind == "cluster"); err != nil {
					t.Fatal(err)
				}
				defer func() {
					logged, _ := admin.Do(ctx, "acl", "log").Slice()
					for _, e := range logged {
						if s := fmt.Sprint(e); strings.Contains(s, user) {
							t.Errorf("%s: ACL LOG: %s", a, s)
						}
					}
					_ = admin.Do(ctx, "acl", "deluser", user).Err()
				}()
			}
			var rdb redis.UniversalClient
			if kind == "cluster" {
				rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: user, Password: pass})
			} else {
				rdb = redis.NewClient(&redis.Options{Addr: addrs[0], Username: user, Password: pass})
			}
			defer rdb.Close()
			exerciseAll(t, rdb, pfx)
		})
	}
}

// setACLUser makes user, allowed Commands and a connection's on the
// keys and channels of prefix.
func setACLUser(ctx context.Context, rdb *redis.Client, user, pass, prefix string, cluster bool) error {
	args := []any{"acl", "setuser", user, "reset", "on", ">" + pass, "~" + prefix + ":*", "resetchannels", "&" + prefix + ":*"}
	for _, c := range append(acl.Grants(cluster), Commands...) {
		known, err := acl.Known(ctx, rdb, c)
		if err != nil {
			return err
		}
		if known {
			args = append(args, "+"+c)
		}
	}
	return rdb.Do(ctx, args...).Err()
}

// exerciseAll drives every method down its paths: admitted, refused,
// waited for (woken by a release), released twice, extended, expired,
// Held.
func exerciseAll(t *testing.T, rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	l, err := New(rdb, PerResource(1), PerClient(1), WithPrefix(prefix), WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a, ok, err := l.TryAcquire(ctx, "r", "a")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := l.TryAcquire(ctx, "r", "b"); ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := a.Extend(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Held(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = a.Release(ctx)
	}()
	b, err := l.Acquire(ctx, "r", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err == nil {
		t.Fatal("a second Release said nothing")
	}
	time.Sleep(300 * time.Millisecond)
	if err := b.Extend(ctx, time.Second); err == nil {
		t.Fatal("Extend of an expired lease said nothing")
	}
}
