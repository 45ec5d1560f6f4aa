#!/usr/bin/env bash
# Runs every test of the module: go vet, then the whole suite under -race
# against miniredis, against a real Redis and against a real 3-master Redis
# Cluster (scripts/cluster.sh), whose default users are denied scripting
# (-@scripting); the fault and failover tests start servers (and a
# Sentinel) of their own. On both, the tests (TestMain, acl_test.go) create ACL users
# allowed only the commands each strategy sends (commands_test.go), run every
# Bucket as one of them, and fail if ACL LOG shows a refusal. This script
# installs redis-server and redis-sentinel if missing, starts both on free loopback ports, and
# stops them on exit, also when tests fail.
#
# Usage: scripts/test.sh [extra go test flags]   (make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

# The three modules (the root, bench/ and otelmetrics/) find one another
# through the workspace (go.work, see docs/releasing.md), not through
# replace directives: use it whatever GOWORK says in the environment, and
# drop a -mod=mod from GOFLAGS, which workspace mode refuses.
export GOWORK="$PWD/go.work"
GOFLAGS=$(printf ' %s ' "${GOFLAGS:-}" | sed 's/ -mod=mod / /g; s/^ *//; s/ *$//')
export GOFLAGS

# install_redis installs what is missing of redis-server, redis-cli and
# redis-sentinel (the failover tests start a Sentinel of their own).
install_redis() {
  local missing=()
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
  command -v redis-sentinel >/dev/null || missing+=(redis-sentinel)
  [ ${#missing[@]} -eq 0 ] && return
  echo "test.sh: installing ${missing[*]} (Debian packages)" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ours PORT DIR: the server on PORT is the one whose pid file is in DIR, not
# another process's that took the port after port_free looked.
ours() {
  local pid
  pid=$(cat "$2/redis.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && redis-cli -p "$1" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"
}

# start_redis DIR: a throwaway server on a free port, no persistence, the
# default user denied every script command. Prints the port.
start_redis() {
  local dir=$1 port pid
  for port in $(seq 16379 16479); do
    port_free "$port" || continue
    rm -f "$dir/redis.pid"
    if redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
      --user default on nopass '~*' '&*' '+@all' '-@scripting' >/dev/null 2>&1; then
      for _ in $(seq 100); do
        ours "$port" "$dir" && { echo "$port"; return; }
        sleep 0.05
      done
      # Ours did not come up on this port (it was taken meanwhile): stop it
      # if it runs at all, and try the next port.
      pid=$(cat "$dir/redis.pid" 2>/dev/null) && grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null && kill "$pid" 2>/dev/null || true
    fi
  done
  echo "test.sh: could not start redis-server; log:" >&2
  cat "$dir/redis.log" >&2 || true
  return 1
}

install_redis
work=$(mktemp -d)
cleanup() {
  [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
  scripts/cluster.sh stop "$work/cluster" || true
  rm -rf "$work"
}
trap cleanup EXIT
port=$(start_redis "$work")
echo "test.sh: $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$port, scripting denied" >&2
scripts/cluster.sh start "$work/cluster" >/dev/null
echo "test.sh: a 3-master cluster on $(cat "$work/cluster/addrs"), scripting denied" >&2

export LEAKYBUCKET_REDIS_ADDR="127.0.0.1:$port"
# The cluster tests pause a master by its pid (SIGSTOP) to test node loss.
export LEAKYBUCKET_CLUSTER_ADDRS LEAKYBUCKET_CLUSTER_PIDS
LEAKYBUCKET_CLUSTER_ADDRS=$(cat "$work/cluster/addrs")
LEAKYBUCKET_CLUSTER_PIDS=$(cat "$work/cluster/pids")
go vet ./...
# The root package runs for several minutes on a loaded machine: past go
# test's default 10 minutes, a timeout would say nothing of the library.
go test -race -shuffle=on -count=1 -timeout 30m "$@" ./...
# The in-flight limiter's timing properties (a released slot reaches a
# waiter within 10 ms p99; with waiters, at least 8 of 10 held 90 % of the
# time, across 4 processes) hold on this machine's loopback, not under
# the race detector, which stretches every handoff many times over: the
# run above checks only the limit there, so they run again without it.
# TestContentionProcesses (waits of 20 ms to 2 s from 4 processes) checks
# the limit and logs the share held: issue #52's targets for it are met
# in most runs, not all, on a loaded machine (INFLIGHT_CONTENTION_SECONDS=6
# runs it with them). The first
# call to a Redis that is gone fails within 50 ms (TestFailFast*) without
# the race detector; under it, within 250 ms.
go test -count=1 -run '^(TestStressProcesses|TestHandoff|TestContentionProcesses|TestFailFastKilled|TestFailFastNeverStarted)$' ./inflight
# TestThousandClients' miniredis half (a thousand Logs clients at once on
# miniredis with ClockTTL, as the HTTP example runs it) skips itself under
# the race detector, which slows miniredis's SCAN past 500 s; without it,
# it takes about 15 s: it runs here, with its real-Redis half again. The
# fallback's decisions in process are asserted within 1 ms p99 here, 5 ms
# under the race detector (TestFallbackKill).
go test -count=1 -run '^(TestThousandClients|TestFallbackKill)$' .
# The benchmark module (bench/, a module of its own): vet it, and run its
# quick mode, which starts a Redis of its own.
(cd bench && go vet ./... && go test -count=1 ./...)
# The OpenTelemetry adapter (otelmetrics/, a module of its own, so that the
# core's users never download OpenTelemetry): vet and test it, on miniredis.
(cd otelmetrics && go vet ./... && go test -race -count=1 ./...)
# The gRPC interceptors (grpclimit/, a module of its own, so that the core's
# users never download gRPC; go.work at the root resolves the core): vet
# them, and test them with a real gRPC server on the real Redis.
(cd grpclimit && go vet ./... && go test -race -count=1 ./...)
