# make test: every test, against miniredis and a real scripting-denied Redis
# (installed and started by scripts/test.sh, stopped afterwards).
.PHONY: test fuzz
test:
	scripts/test.sh

# make fuzz: a short run of each fuzz target (FUZZTIME=1m for longer).
FUZZTIME ?= 20s
fuzz:
	go test -run='^$$' -fuzz='^FuzzKeys$$' -fuzztime=$(FUZZTIME) .
	go test -run='^$$' -fuzz='^FuzzAllowInput$$' -fuzztime=$(FUZZTIME) .

# make bench: the benchmark of issue 5 (bench/, a module of its own): this
# library against redis_rate, a naive redislock baseline and one round trip,
# on a redis-server it starts itself; writes bench/BENCHMARKS.md and
# bench/benchmarks.png. BENCHFLAGS=-quick for a smoke run of seconds.
.PHONY: bench
bench:
	cd bench && go run . $(BENCHFLAGS)
