# make test: every test, against miniredis and a real scripting-denied Redis
# (installed and started by scripts/test.sh, stopped afterwards).
.PHONY: test fuzz
test:
	scripts/test.sh

# make fuzz: a short run of each fuzz target (FUZZTIME=1m for longer).
FUZZTIME ?= 20s
fuzz:
	go test -run='^$$' -fuzz='^FuzzKeys$$' -fuzztime=$(FUZZTIME) ./internal/keys
	go test -run='^$$' -fuzz='^FuzzAllowInput$$' -fuzztime=$(FUZZTIME) .
	go test -run='^$$' -fuzz='^FuzzParseLimit$$' -fuzztime=$(FUZZTIME) ./cmd/leakybucket

# make bench: the benchmark (bench/, a module of its own): this
# library against redis_rate, ulule/limiter, a naive redislock baseline and
# one round trip, on two redis-servers it starts itself (the library's denies
# scripting); writes bench/BENCHMARKS.md and bench/benchmarks.png.
# BENCHFLAGS=-quick for a smoke run of seconds.
.PHONY: bench
bench:
	cd bench && go run . $(BENCHFLAGS)
