#!/usr/bin/env bash
# deploy/compose.yaml's cluster as plain processes on this machine, without Docker: the same
# services with the environment, command, volumes, health checks and stop grace periods compose
# would give their containers. The test suite runs it (integration-tests/tests/deploy.rs), so the
# configuration the compose file carries is what gets exercised.
#
#   deploy/compose-local.sh start    start every service; wait until each listens and sees the whole cluster with a leader
#   deploy/compose-local.sh health   run each service's healthcheck once; exit 1 if one fails
#   deploy/compose-local.sh status   the cluster as the first service's node sees it
#   deploy/compose-local.sh stop     SIGTERM each node, SIGKILL after its stop_grace_period
#   deploy/compose-local.sh plan     print what start runs, and run nothing
#
# How a container becomes a process: `docker compose config` reads the compose file (anchors,
# defaults and validation are compose's own), and the image's `ENV KEY=VALUE` lines and ENTRYPOINT
# come from the last stage of the Dockerfile the service (or the service building its image)
# names. Service number N, in name order, gets a loopback address of its own, PREFIX.N: as each
# container has its own network namespace, each process has its own address, and the ports stay
# those of the file. In each environment value, command argument and healthcheck argument:
#   - HOST_IP:PUBLISHED of any service's published port becomes that service's ADDRESS:TARGET
#     (127.0.0.1:7401 -> 127.0.100.1:7400);
#   - a service name before :PORT becomes that service's address (b:7410 -> 127.0.100.2:7410);
#   - 0.0.0.0, 127.0.0.1 and localhost become the service's own address;
#   - a volume's mount point (/var/lib/ferry) becomes its directory, $DIR/volumes/<volume>.
# A process gets that environment only (env -i; PATH and HOME aside), as a container would.
#
# Settings (environment): FERRY_COMPOSE_LOCAL_DIR, where data, logs and plans go (default
# ./compose-local; a restart resumes the same cluster); FERRY_COMPOSE_LOCAL_ADDRS, PREFIX (default
# 127.0.100, not 127.0.0); FERRY_COMPOSE_FILE (default deploy/compose.yaml); FERRY_BIN, the
# binary (default: the release build). Needs jq, curl (the healthcheck) and compose v2 (exit 3
# when one is missing):
# `docker compose`, or `docker-compose` on the PATH or in ~/.cache/ferry-tools/bin, where
# scripts/install-deps --tests puts one.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ferry-target}"
FERRY_BIN="${FERRY_BIN:-$CARGO_TARGET_DIR/release/ferry}"
DIR="${FERRY_COMPOSE_LOCAL_DIR:-$PWD/compose-local}"
PREFIX="${FERRY_COMPOSE_LOCAL_ADDRS:-127.0.100}"
COMPOSE_FILE="${FERRY_COMPOSE_FILE:-deploy/compose.yaml}"
TOOLS_BIN="$HOME/.cache/ferry-tools/bin"
# One service's plan, as use_plan sets it.
plans=() addr='' grace_s=10 health_timeout_s=30 environment=() argv=() health=() dirs=()

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

die() {
  echo "error: $*" >&2
  exit 1
}

# Runs compose v2 (its `config` needs no Docker daemon).
compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose "$@"
    return
  fi
  local c
  for c in docker-compose "$TOOLS_BIN/docker-compose"; do
    if "$c" version 2>/dev/null | grep -q 'version v2'; then
      "$c" "$@"
      return
    fi
  done
  echo "error: no Docker Compose v2 here (docker compose, or docker-compose v2): scripts/install-deps --tests installs one" >&2
  exit 3
}

# The last stage of a Dockerfile: its `ENV KEY=VALUE` lines and exec-form ENTRYPOINT, as JSON.
image_json() {
  local dockerfile=$1 line env='{}' entrypoint='null'
  [[ -f "$dockerfile" ]] || die "no Dockerfile at $dockerfile"
  while IFS= read -r line; do
    case "$line" in
      "ENV "*)
        [[ "$line" =~ ^ENV\ ([A-Za-z_][A-Za-z0-9_]*)=([^[:space:]\"\']*)$ ]] ||
          die "$dockerfile: '$line': write ENV as one KEY=VALUE per line, unquoted"
        env=$(jq -c --arg k "${BASH_REMATCH[1]}" --arg v "${BASH_REMATCH[2]}" '.[$k] = $v' <<<"$env") ;;
      "ENTRYPOINT "*)
        entrypoint=$(jq -c 'if type == "array" then . else error("") end' <<<"${line#ENTRYPOINT }" 2>/dev/null) ||
          die "$dockerfile: '$line': write ENTRYPOINT in exec form, [\"...\", ...]" ;;
    esac
  done < <(awk '/^FROM[ \t]/ { stage = "" } { stage = stage $0 "\n" } END { printf "%s", stage }' "$dockerfile")
  jq -cn --argjson env "$env" --argjson entrypoint "$entrypoint" '{env: $env, entrypoint: $entrypoint}'
}

# Exits 3 when a tool the script needs is missing.
need_tools() {
  local t
  for t in jq curl; do
    command -v "$t" >/dev/null 2>&1 ||
      { echo "error: $t is missing: scripts/install-deps --tests installs it" >&2; exit 3; }
  done
}

# Writes $DIR/plans.sh: for each service a function setting addr, grace_s,
# health_timeout_s, environment, argv, health and dirs.
make_plans() {
  [[ "$PREFIX" =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}$ && "$PREFIX" != "127.0.0" ]] ||
    die "FERRY_COMPOSE_LOCAL_ADDRS=$PREFIX: give three numbers of a loopback address, 127.X.Y, other than 127.0.0"
  need_tools
  mkdir -p "$DIR"
  compose -f "$COMPOSE_FILE" config --format json >"$DIR/compose.json" ||
    die "docker compose config refused $COMPOSE_FILE (above)"
  # Each service's image: from the Dockerfile it builds, or the one of the service building it.
  local images='{}' svc dockerfile
  for svc in $(jq -r '.services | keys[]' "$DIR/compose.json"); do
    dockerfile=$(jq -r --arg s "$svc" '
      .services as $all | $all[$s].image as $image
      | ([$all[$s]] + [$all[] | select(.image == $image)]) | map(select(.build)) | first
      | if . == null then ""
        elif (.build.dockerfile // "") | startswith("/") then .build.dockerfile
        else .build.context + "/" + (.build.dockerfile // "Dockerfile")
        end' "$DIR/compose.json")
    [[ -n "$dockerfile" ]] ||
      die "service $svc runs an image no service of $COMPOSE_FILE builds: only images built here can run as processes"
    images=$(jq -c --arg s "$svc" --argjson img "$(image_json "$dockerfile")" '.[$s] = $img' <<<"$images")
  done
  jq -r --arg prefix "$PREFIX" --arg dir "$DIR" --argjson images "$images" -f /dev/stdin \
    "$DIR/compose.json" >"$DIR/plans.sh" <<'JQ'
# A Go duration as compose prints it (1m0s, 15s, 500ms), in seconds.
def seconds:
  if . == null then 10 else
    [scan("([0-9.]+)(h|ms|us|µs|ns|m|s)")
     | (.[0] | tonumber) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[.[1]]]
    | add | ceil
  end;
def quote_re: gsub("(?<c>[.^$*+?()\\[\\]{}|\\\\])"; "\\\(.c)");
. as $c
| ($c.services | keys) as $names
| ($names | to_entries | map({key: .value, value: "\($prefix).\(.key + 1)"}) | from_entries) as $addr
| [$c.services | to_entries[] | .key as $s | (.value.ports // [])[]
   | {from: "\(if (.host_ip // "") == "" then "0.0.0.0" else .host_ip end):\(.published)",
      to: "\($addr[$s]):\(.target)"}] as $published
| $c.services | to_entries[] | .key as $s | .value as $svc
| [($svc.volumes // [])[] | select(.type == "volume" or .type == "bind")
   | {target: .target,
      dir: (if .type == "volume" then "\($dir)/volumes/\(.source)" else .source end)}] as $vols
| def rewrite:
    reduce $published[] as $p (.;
      gsub("(?<![0-9.])" + ($p.from | quote_re) + "(?![0-9])"; $p.to))
    | reduce $names[] as $n (.;
      gsub("(?<![A-Za-z0-9_.-])" + ($n | quote_re) + ":(?=[0-9])"; "\($addr[$n]):"))
    | gsub("(?<![0-9.])(0\\.0\\.0\\.0|127\\.0\\.0\\.1)(?![0-9])"; $addr[$s])
    | gsub("(?<![A-Za-z0-9_.-])localhost(?![A-Za-z0-9_.-])"; $addr[$s])
    | reduce $vols[] as $v (.;
      gsub("(?<![^=:])" + ($v.target | quote_re) + "(?=/|$)"; $v.dir));
  ($images[$s]) as $img
| (($img.env + ($svc.environment // {})) | to_entries | map("\(.key)=\(.value // "" | rewrite)")) as $env
| (($svc.entrypoint // $img.entrypoint // []) + ($svc.command // [])) as $argv
| ($svc.healthcheck // {}) as $hc
| (if ($hc.disable // false) or ($hc.test // null) == null then []
   elif $hc.test[0] == "CMD" then $hc.test[1:]
   elif $hc.test[0] == "CMD-SHELL" then ["sh", "-c", $hc.test[1]]
   else [] end) as $health
| "# service \($s)",
  "plans+=(\($s | @sh))",
  "plan_\($s | gsub("[^A-Za-z0-9_]"; "_"))() {",
  "  addr=\($addr[$s] | @sh) grace_s=\($svc.stop_grace_period | seconds)",
  "  health_timeout_s=\($hc.timeout | seconds)",
  "  environment=(\($env | @sh))",
  "  argv=(\($argv | map(rewrite) | @sh))",
  "  health=(\($health | map(rewrite) | @sh))",
  "  dirs=(\($vols | map(.dir) | @sh))",
  "}"
JQ
}

# Loads the plans written by make_plans (or by the start that is running).
load_plans() {
  plans=()
  [[ -f "$DIR/plans.sh" ]] || return 0
  # shellcheck disable=SC1091
  source "$DIR/plans.sh"
}

# Sets the plan variables of service $1.
use_plan() {
  "plan_${1//[^A-Za-z0-9_]/_}"
}

# The process id of service $1's node while it runs (an exited one not yet reaped does not).
running_pid() {
  local f="$DIR/$1/ferry.pid" pid
  [[ -f "$f" ]] || return 1
  pid=$(cat "$f")
  alive "$pid" && echo "$pid"
}

alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ "$state" != Z* ]]
}

client_addr() {
  sed -n 's/^ferry .* listening on //p' "$DIR/$1/stdout.log" 2>/dev/null | head -1
}

# A start that fails stops what it started.
start_failed() {
  stop >/dev/null 2>&1 || true
  exit 1
}

start() {
  local svc
  load_plans
  for svc in "${plans[@]}"; do
    if running_pid "$svc" >/dev/null; then
      die "service $svc is already running (deploy/compose-local.sh stop first)"
    fi
  done
  [[ -x "$FERRY_BIN" ]] || die "no ferry binary at $FERRY_BIN: cargo build --release --workspace --bins, or set FERRY_BIN"
  make_plans
  load_plans
  [[ ${#plans[@]} -gt 0 ]] || die "$COMPOSE_FILE has no services"
  for svc in "${plans[@]}"; do
    use_plan "$svc"
    [[ "$(basename "${argv[0]:-}")" == ferry ]] ||
      die "service $svc runs '${argv[0]:-nothing}', not the ferry binary"
  done
  for svc in "${plans[@]}"; do
    use_plan "$svc"
    mkdir -p "$DIR/$svc" "${dirs[@]}"
    : >"$DIR/$svc/stdout.log"
    env -i PATH="$PATH" HOME="$DIR/$svc" "${environment[@]}" "$FERRY_BIN" "${argv[@]:1}" \
      </dev/null >"$DIR/$svc/stdout.log" 2>"$DIR/$svc/ferry.log" &
    echo $! >"$DIR/$svc/ferry.pid"
  done
  # Each node prints its client address once it serves: at most 60 s each.
  local tries
  for svc in "${plans[@]}"; do
    tries=0
    until [[ -n "$(client_addr "$svc")" ]]; do
      tries=$((tries + 1))
      if ((tries > 600)) || ! running_pid "$svc" >/dev/null; then
        echo "service $svc did not start; the end of its log ($DIR/$svc/ferry.log):" >&2
        tail -5 "$DIR/$svc/ferry.log" >&2 || true
        start_failed
      fi
      sleep 0.1
    done
  done
  # Then for the cluster to form (an election takes 1-2 s): every node names a leader and lists
  # every service as a node, so a command sent to any of them right after `start` sees the whole
  # cluster. At most 30 s in all.
  local expected=${#plans[@]}
  tries=0
  for svc in "${plans[@]}"; do
    until "$FERRY_BIN" --server "$(client_addr "$svc")" -o json cluster status 2>/dev/null |
        jq -e --argjson n "$expected" \
          'select(.leader_node_id != null and .leader_node_id != "" and (.nodes | length) == $n)' \
          >/dev/null 2>&1; do
      tries=$((tries + 1))
      if ((tries > 300)); then
        echo "the nodes run but formed no cluster within 30 s ($svc sees no leader or not every node); see $DIR/*/ferry.log" >&2
        start_failed
      fi
      sleep 0.1
    done
  done
  for svc in "${plans[@]}"; do
    use_plan "$svc"
    printf '%s: pid %s, clients %s, %s\n' "$svc" "$(running_pid "$svc")" "$(client_addr "$svc")" \
      "$(sed -n 's/^metrics on /metrics /p' "$DIR/$svc/stdout.log" | head -1)"
  done
}

health() {
  local svc status=0 out code
  load_plans
  [[ ${#plans[@]} -gt 0 ]] || die "nothing started here ($DIR)"
  for svc in "${plans[@]}"; do
    use_plan "$svc"
    if [[ ${#health[@]} -eq 0 ]]; then
      echo "$svc: no healthcheck"
      continue
    fi
    code=0
    out=$(timeout "$health_timeout_s" "${health[@]}" 2>&1) || code=$?
    if ((code == 0)); then
      echo "$svc: healthy"
    else
      echo "$svc: unhealthy (exit $code): ${health[*]}: $out"
      status=1
    fi
  done
  return $status
}

status() {
  local svc
  load_plans
  for svc in "${plans[@]}"; do
    if running_pid "$svc" >/dev/null; then
      "$FERRY_BIN" --server "$(client_addr "$svc")" cluster status
      return
    fi
  done
  die "no node of $COMPOSE_FILE runs here ($DIR)"
}

stop() {
  local svc pid waited signalled=()
  load_plans
  for svc in "${plans[@]}"; do
    pid=$(running_pid "$svc") || { rm -f "$DIR/$svc/ferry.pid"; continue; }
    kill -TERM "$pid" 2>/dev/null || true
    signalled+=("$svc:$pid")
  done
  [[ ${#signalled[@]} -gt 0 ]] || { echo "no node is running"; return 0; }
  # As `docker stop`: each gets its stop_grace_period, then SIGKILL.
  for svc in "${signalled[@]}"; do
    pid=${svc##*:} svc=${svc%:*}
    use_plan "$svc"
    waited=0
    while alive "$pid" && ((waited < grace_s * 10)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    if alive "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
      echo "$svc: killed (SIGKILL) after its stop_grace_period, ${grace_s} s"
    else
      echo "$svc: stopped"
    fi
    rm -f "$DIR/$svc/ferry.pid"
  done
}

plan() {
  local svc
  make_plans
  load_plans
  for svc in "${plans[@]}"; do
    use_plan "$svc"
    echo "$svc ($addr), stop grace ${grace_s} s:"
    echo "  env -i ${environment[*]} \\"
    echo "    $FERRY_BIN ${argv[*]:1:${#argv[@]}}"
    echo "  healthcheck: ${health[*]:-none}"
  done
}

case "${1:-}" in
  start) start ;;
  health) health ;;
  status) status ;;
  stop) stop ;;
  plan) plan ;;
  *) usage ;;
esac
