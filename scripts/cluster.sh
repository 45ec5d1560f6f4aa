#!/usr/bin/env bash
# A throwaway 3-master Redis Cluster on loopback, for the cluster tests.
#
#   scripts/cluster.sh start DIR   start it, with its files under DIR (made
#                                  if missing); print the two exports below
#   scripts/cluster.sh stop DIR    stop it and delete DIR
#
# Each master runs Debian's redis-server, cluster-enabled, without
# persistence, with the default user denied scripting (-@scripting), on the
# first free loopback ports from 17000 up whose cluster bus port (+10000) is
# free too. Slots are split evenly (redis-cli --cluster create, no replicas),
# and start returns once every node reports cluster_state:ok.
# --cluster-require-full-coverage no keeps the other masters serving while
# one is paused (the node-stop test).
#
# start writes, in DIR:
#   addrs          host:port of the masters, comma-separated
#   pids           their process ids, comma-separated, in the same order
#   PORT/          each node's nodes.conf, redis.pid and redis.log
# and prints
#   export LEAKYBUCKET_CLUSTER_ADDRS=127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
#   export LEAKYBUCKET_CLUSTER_PIDS=PID1,PID2,PID3
# If it fails, it prints the nodes' logs, stops what it started, and exits 1.
set -euo pipefail

MASTERS=3
FIRST_PORT=${LEAKYBUCKET_CLUSTER_FIRST_PORT:-17000}
NODE_TIMEOUT_MS=5000 # the node-stop test pauses a master for well under this
READY_SECONDS=30

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# our_node PORT DIR: the server on PORT is the one whose pid file is in DIR.
our_node() {
  local pid
  pid=$(cat "$2/redis.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && redis-cli -p "$1" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"
}

# start_node PORT DIR: one cluster-enabled master; fails if it did not come
# up as ours (the port was taken meanwhile, say).
start_node() {
  local port=$1 dir=$2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 \
    --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
    --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-require-full-coverage no \
    --save "" --appendonly no --daemonize yes \
    --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --user default on nopass '~*' '&*' '+@all' '-@scripting' >/dev/null 2>&1 || return 1
  for _ in $(seq 100); do
    our_node "$port" "$dir" && return 0
    sleep 0.05
  done
  stop_pidfile "$dir/redis.pid"
  return 1
}

# redis_pid FILE: the pid in FILE, if that process is still a redis-server.
redis_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# stop_pids PID...: SIGTERM them all, then SIGKILL whatever still runs after
# 5 s. SIGCONT first: a node a test left paused would not act on SIGTERM.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill -CONT "$@" 2>/dev/null || true
  kill -TERM "$@" 2>/dev/null || true
  local pid alive
  for _ in $(seq 100); do
    alive=()
    for pid in "$@"; do
      kill -0 "$pid" 2>/dev/null && alive+=("$pid")
    done
    [ ${#alive[@]} -gt 0 ] || return 0
    set -- "${alive[@]}"
    sleep 0.05
  done
  kill -KILL "$@" 2>/dev/null || true
}

stop_pidfile() {
  local pid
  pid=$(redis_pid "$1") && stop_pids "$pid" || true
}

stop() {
  local dir=$1 f pids=()
  for f in "$dir"/*/redis.pid; do
    [ -e "$f" ] && pids+=($(redis_pid "$f" || true))
  done
  stop_pids "${pids[@]}"
  rm -rf "$dir"
}

fail() {
  local dir=$1 log
  shift
  echo "cluster.sh: $*" >&2
  for log in "$dir"/*/redis.log; do
    [ -e "$log" ] || continue
    echo "--- $log" >&2
    tail -n 40 "$log" >&2
  done
  stop "$dir"
  exit 1
}

start() {
  local dir=$1 port ports=() addrs=() pids=()
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  for port in $(seq "$FIRST_PORT" $((FIRST_PORT + 200))); do
    [ ${#ports[@]} -lt "$MASTERS" ] || break
    port_free "$port" && port_free $((port + 10000)) || continue
    if start_node "$port" "$dir/$port"; then
      ports+=("$port")
    else
      rm -rf "${dir:?}/$port"
    fi
  done
  [ ${#ports[@]} -eq "$MASTERS" ] || fail "$dir" "found only ${#ports[@]} free port pairs from $FIRST_PORT"
  for port in "${ports[@]}"; do
    addrs+=("127.0.0.1:$port")
    pids+=("$(cat "$dir/$port/redis.pid")")
  done

  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; fail "$dir" "redis-cli --cluster create failed"; }

  local deadline=$((SECONDS + READY_SECONDS)) ok
  while :; do
    ok=0
    for port in "${ports[@]}"; do
      redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && ok=$((ok + 1))
    done
    [ "$ok" -eq "$MASTERS" ] && break
    [ "$SECONDS" -lt "$deadline" ] || fail "$dir" "cluster_state:ok on $ok of $MASTERS nodes after ${READY_SECONDS}s"
    sleep 0.05
  done

  (IFS=,; echo "${addrs[*]}") >"$dir/addrs"
  (IFS=,; echo "${pids[*]}") >"$dir/pids"
  echo "export LEAKYBUCKET_CLUSTER_ADDRS=$(cat "$dir/addrs")"
  echo "export LEAKYBUCKET_CLUSTER_PIDS=$(cat "$dir/pids")"
}

case "${1:-} ${2:+dir}" in
"start dir") start "$2" ;;
"stop dir") stop "$2" ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
