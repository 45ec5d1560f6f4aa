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
