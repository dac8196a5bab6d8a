#!/usr/bin/env bash
# Ember against redis-server with redis-benchmark (issue 5's table), and launch
# time against Redis loading its RDB file. One machine, one client, alternating
# rounds; prints one line per (server, mode, pipeline, test, round) and medians.
#
#   bash scripts/bench_server.sh [rounds] [requests]      # throughput table
#   bash scripts/bench_server.sh launch [keys...]         # launch times
#
# Needs redis-server and redis-benchmark (Debian: redis-server, redis-tools) and a
# release build (cargo build --release). Servers bind 127.0.0.1 on ports 7401-7404.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EMBER=$PWD/target/release/ember
work=$(mktemp -d /tmp/ember-bench.XXXXXX)
trap 'pkill -f "serve --port 740[1-4]" 2>/dev/null || true; pkill -f "redis-server 127.0.0.1:740[1-4]" 2>/dev/null || true; rm -rf "$work"' EXIT

wait_ping() { for _ in $(seq 1 3000); do redis-cli -p "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.01; done; return 1; }

start() { # name port
  local name=$1 port=$2 d="$work/$1"
  rm -rf "$d"; mkdir -p "$d"
  case $name in
    ember-pmem) (cd "$d" && "$EMBER" serve --port "$port" --durability pmem >"$d/log" 2>&1 &) ;;
    ember-msync) (cd "$d" && "$EMBER" serve --port "$port" --durability msync >"$d/log" 2>&1 &) ;;
    redis-everysec) redis-server --port "$port" --bind 127.0.0.1 --dir "$d" --save '' --appendonly yes --appendfsync everysec --daemonize yes --logfile "$d/log" ;;
    redis-always) redis-server --port "$port" --bind 127.0.0.1 --dir "$d" --save '' --appendonly yes --appendfsync always --daemonize yes --logfile "$d/log" ;;
  esac
  wait_ping "$port"
}

stop() { redis-cli -p "$1" shutdown nosave >/dev/null 2>&1 || true; sleep 0.5; }

if [ "${1:-}" = "launch" ]; then
  shift
  for keys in "${@:-1000000 5000000}"; do
    for srv in ember redis; do
      d="$work/launch-$srv"; rm -rf "$d"; mkdir -p "$d"
      if [ $srv = ember ]; then
        (cd "$d" && "$EMBER" serve --port 7401 --heap-size 4gb >"$d/log" 2>&1 &)
      else
        redis-server --port 7401 --bind 127.0.0.1 --dir "$d" --save '' --appendonly no --daemonize yes --logfile "$d/log"
      fi
      wait_ping 7401
      redis-benchmark -p 7401 -t set -d 100 -r "$keys" -n $((keys * 3)) -P 64 -c 8 -q >/dev/null 2>&1
      [ $srv = redis ] && redis-cli -p 7401 save >/dev/null
      n=$(redis-cli -p 7401 dbsize)
      t0=$(date +%s.%N)
      redis-cli -p 7401 shutdown >/dev/null 2>&1 || true
      while pgrep -f "port 7401" >/dev/null; do sleep 0.01; done
      t1=$(date +%s.%N)
      if [ $srv = ember ]; then
        (cd "$d" && "$EMBER" serve --port 7401 --heap-size 4gb >>"$d/log" 2>&1 &)
      else
        redis-server --port 7401 --bind 127.0.0.1 --dir "$d" --save '' --appendonly no --daemonize yes --logfile "$d/log2"
      fi
      # Ready = PING answered PONG (Redis answers -LOADING while it loads, and
      # redis-cli prints connection errors on stdout).
      until [ "$(redis-cli -p 7401 ping 2>/dev/null)" = "PONG" ]; do sleep 0.002; done
      t2=$(date +%s.%N)
      echo "launch $srv keys=$n shutdown_s=$(awk "BEGIN{print $t1 - $t0}") launch_s=$(awk "BEGIN{print $t2 - $t1}") heap_or_rdb=$(du -sh "$d" | cut -f1)"
      [ $srv = ember ] && grep -E "serving|shut down" "$d/log" | tail -2
      stop 7401
    done
  done
  exit 0
fi

rounds=${1:-3}
n=${2:-200000}
out="$work/results"
for r in $(seq 1 "$rounds"); do
  for srv in ember-pmem redis-everysec ember-msync redis-always; do
    start "$srv" 7402
    for p in 1 16; do
      nn=$n; [ "$p" = 16 ] && nn=$((n * 4))
      redis-benchmark -p 7402 -t set,get,incr -d 100 -r 100000 -c 50 -n "$nn" -P "$p" -q 2>/dev/null |
        tr '\r' '\n' | grep "requests per second" |
        awk -v s="$srv" -v p="$p" -v r="$r" '{sub(":","",$1); print s, "P" p, $1, r, $2}' | tee -a "$out"
    done
    stop 7402
  done
done
echo "== medians (requests per second)"
python3 - "$out" <<'PY'
import sys, statistics, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    srv, p, test, _r, rps = line.split()
    v[(srv, p, test)].append(float(rps))
for k in sorted(v):
    print(*k, round(statistics.median(v[k])), "runs=%d" % len(v[k]))
PY
