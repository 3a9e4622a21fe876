#!/usr/bin/env bash
# promtool, for the test that checks every daemon's and replica's /metrics
# (tests/integration/test_promtool.py): Debian's `prometheus` package, installed with apt-get when
# promtool is missing (idempotent: a no-op when it is there).
#
#   deploy/promtool.sh          install if missing, then print promtool's version
set -euo pipefail

log() { printf 'promtool: %s\n' "$*" >&2; }
die() {
  printf 'promtool: ERROR: %s\n' "$*" >&2
  exit 1
}

if ! command -v promtool >/dev/null; then
  command -v apt-get >/dev/null || die "promtool is missing and there is no apt-get: install Prometheus's promtool"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "promtool is missing; install it once with: sudo apt-get install -y prometheus"
    sudo="sudo"
  fi
  aptlog="${TMPDIR:-/tmp}/ctr-apt-prometheus.log"
  log "promtool missing: apt-get install prometheus (log: $aptlog)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -q --no-install-recommends prometheus >"$aptlog" 2>&1; then
    log "install failed, running apt-get update and retrying"
    $sudo apt-get update -q >>"$aptlog" 2>&1 || true
    $sudo apt-get install -y -q --no-install-recommends prometheus >>"$aptlog" 2>&1 ||
      die "apt-get install prometheus failed; see $aptlog"
  fi
  # the package starts a Prometheus server where systemd runs; the tests need only the binary
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
promtool --version 2>&1 | head -1 >&2
