module github.com/leakybucket/leakybucket/bench

go 1.26.0

replace github.com/leakybucket/leakybucket => ../

require (
	github.com/bsm/redislock v0.10.0
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/leakybucket/leakybucket v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/image v0.47.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
