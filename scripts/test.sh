#!/usr/bin/env bash
# Ember's whole test suite: the README's test command, and what .ci/run calls.
# Installs what it needs, runs formatting and lint checks, every test (unit,
# crash simulator, SIGKILL, model-based, concurrency, CLI) and the loom models,
# then prints one summary line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TERM_COLOR=never

need() { command -v "$1" >/dev/null 2>&1; }
if ! need cargo; then
  echo "test.sh: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
for comp in rustfmt clippy; do
  if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$comp"
  fi
done

# Installs Debian packages ($2...) that `why` ($1) needs, or stops.
apt_install() {
  local why=$1
  shift
  if need apt-get; then
    echo "== installing $* ($why)"
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
  else
    echo "test.sh: $* needed ($why); install them" >&2
    exit 1
  fi
}

# The server's differential tests run against a real redis-server, and its
# end-to-end tests use redis-cli (Debian packages redis-server, redis-tools).
if ! need redis-server || ! need redis-cli; then
  apt_install "differential tests" redis-server redis-tools
fi

# Installs the Python module $1 (pip package $2, else Debian package $3)
# for a client-library test, or says that test is skipped.
py_install() {
  need python3 || return 0
  python3 -c "import $1" >/dev/null 2>&1 && return 0
  echo "== installing $2 (client-library tests)"
  python3 -m pip install -q "$2" >/dev/null 2>&1 \
    || { if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$3" >/dev/null; } \
    || echo "test.sh: $2 could not be installed; its test parts are skipped" >&2
}

# Client-library tests drive ember with redis-py (python3-redis), and the
# memcached port with pymemcache.
py_install redis redis python3-redis
py_install pymemcache pymemcache python3-pymemcache

# The memcached port's differential tests run against a real memcached 1.6
# (Debian package memcached).
if ! [ -x /usr/bin/memcached ]; then
  apt_install "differential tests of the memcached port" memcached
fi

# The logfree-fig11 scenario's smoke tests start a real memcached (Debian
# package memcached).
if ! need memcached && need apt-get; then
  echo "== installing memcached (logfree-fig11 scenario)"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq memcached >/dev/null \
    || { $SUDO apt-get update -qq || true; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq memcached >/dev/null; }
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace 2>&1 | tee -a "$log"

echo "== loom models"
# One model at a time: on two vCPUs the loom models ran slower side by side
# (loom_link 91 s with two test threads, 57 s with one; loom_staged 49 s, 28 s).
loom() {
  RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p "$1" --test "$2" --release -- --test-threads 1 2>&1 | tee -a "$log"
}
loom pmem loom_slab
loom index loom_link
loom engine loom_lentry
loom engine loom_staged

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
grep -E '^crash-sim: ' "$log" || { echo "test.sh: the heap crash simulator printed no summary" >&2; exit 1; }
grep -E '^index crash-sim' "$log" || { echo "test.sh: the index crash simulator printed no summary" >&2; exit 1; }
grep -E '^power-loss-sim: ' "$log" || { echo "test.sh: the power-loss simulator printed no summary" >&2; exit 1; }
echo "all: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
