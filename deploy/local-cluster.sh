#!/usr/bin/env bash
# A cluster of N nodes (default 3) on this machine, for trying Ferry's cluster:
#
#   deploy/local-cluster.sh start [N]   start nodes n1..nN (client ports 7401.., peer ports 7411..)
#   deploy/local-cluster.sh status      the cluster as n1 sees it
#   deploy/local-cluster.sh stop        stop every node (SIGTERM, then wait)
#
# Data and logs go under $FERRY_LOCAL_CLUSTER_DIR (default ./local-cluster); a restart resumes
# the same cluster. The binary is $FERRY_BIN, or the release build scripts/run makes.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ferry-target}"
FERRY_BIN="${FERRY_BIN:-$CARGO_TARGET_DIR/release/ferry}"
DIR="${FERRY_LOCAL_CLUSTER_DIR:-$PWD/local-cluster}"
NODES_MAX=9

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

need_binary() {
  if [[ ! -x "$FERRY_BIN" ]]; then
    scripts/install-deps
    cargo build --release --workspace --bins
  fi
}

running_pids() {
  local f
  for f in "$DIR"/n*/ferry.pid; do
    [[ -e "$f" ]] || continue
    local pid
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
  done
}

start() {
  local n="${1:-3}"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || (( n < 1 || n > NODES_MAX )); then
    echo "N must be 1 to $NODES_MAX (got $n)" >&2
    exit 2
  fi
  if [[ -n "$(running_pids)" ]]; then
    echo "a local cluster is already running (deploy/local-cluster.sh stop first)" >&2
    exit 1
  fi
  need_binary
  local initial="" i
  for i in $(seq 1 "$n"); do
    initial+="${initial:+,}n$i=127.0.0.1:$((7410 + i))"
  done
  for i in $(seq 1 "$n"); do
    local d="$DIR/n$i"
    mkdir -p "$d"
    # The server reads every FERRY_ variable as configuration: not this script's own.
    env -u FERRY_BIN -u FERRY_LOCAL_CLUSTER_DIR "$FERRY_BIN" server --node-id "n$i" --data-dir "$d" \
      --listen "127.0.0.1:$((7400 + i))" --peer-listen "127.0.0.1:$((7410 + i))" \
      --initial-cluster "$initial" >"$d/stdout.log" 2>"$d/ferry.log" &
    echo $! >"$d/ferry.pid"
  done
  # Each node prints its address once it serves; wait for that, at most 60 s per node.
  for i in $(seq 1 "$n"); do
    local tries=0
    until grep -q "listening on" "$DIR/n$i/stdout.log" 2>/dev/null; do
      tries=$((tries + 1))
      if (( tries > 600 )) || ! kill -0 "$(cat "$DIR/n$i/ferry.pid")" 2>/dev/null; then
        echo "node n$i did not start; its log: $DIR/n$i/ferry.log" >&2
        tail -5 "$DIR/n$i/ferry.log" >&2 || true
        exit 1
      fi
      sleep 0.1
    done
  done
  # Then for the first leader to form the cluster (an election takes 1-2 s), at most 30 s: every
  # node names the leader, which it can only once it has applied the entry that lists the nodes.
  local tries=0
  for i in $(seq 1 "$n"); do
    until "$FERRY_BIN" --server "127.0.0.1:$((7400 + i))" -o json cluster status 2>/dev/null \
        | grep -q '"leader_node_id":"n'; do
      tries=$((tries + 1))
      if (( tries > 300 )); then
        echo "the nodes run but formed no cluster within 30 s (n$i names no leader); see $DIR/n*/ferry.log" >&2
        exit 1
      fi
      sleep 0.1
    done
  done
  echo "started $n nodes: clients connect to 127.0.0.1:7401..$((7400 + n)) (any node)"
  echo "try: $FERRY_BIN --server 127.0.0.1:7401 cluster status"
}

stop() {
  local pids
  pids=$(running_pids)
  if [[ -z "$pids" ]]; then
    echo "no local cluster node is running"
    return 0
  fi
  # shellcheck disable=SC2086
  kill -TERM $pids
  local tries=0
  while [[ -n "$(running_pids)" ]] && (( tries < 300 )); do
    tries=$((tries + 1))
    sleep 0.1
  done
  if [[ -n "$(running_pids)" ]]; then
    # shellcheck disable=SC2046
    kill -KILL $(running_pids) 2>/dev/null || true
  fi
  rm -f "$DIR"/n*/ferry.pid
  echo "stopped"
}

status() {
  if [[ -z "$(running_pids)" ]]; then
    echo "no local cluster node is running"
    exit 1
  fi
  need_binary
  local f port
  for f in "$DIR"/n*/ferry.pid; do
    port=$((7400 + $(basename "$(dirname "$f")" | tr -d n)))
    if kill -0 "$(cat "$f")" 2>/dev/null && "$FERRY_BIN" --server "127.0.0.1:$port" cluster status; then
      return 0
    fi
  done
  exit 1
}

case "${1:-}" in
  start) start "${2:-3}" ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
