#!/usr/bin/env bash
# Headless Chromium and its driver for the MLflow UI test (tests/integration/test_rollback.py):
# Debian's `chromium` and `chromium-driver` packages, installed with apt-get when either binary is
# missing (idempotent: a no-op when both are there). Selenium is pointed at /usr/bin/chromedriver
# explicitly, so its Selenium Manager never downloads a browser or a driver.
#
#   deploy/browser.sh          install if missing, then print the two versions
set -euo pipefail

log() { printf 'browser: %s\n' "$*" >&2; }
die() {
  printf 'browser: ERROR: %s\n' "$*" >&2
  exit 1
}

have() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

if ! have; then
  command -v apt-get >/dev/null ||
    die "chromium/chromedriver are missing and there is no apt-get: install Chromium and its chromedriver"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "chromium is missing; install it once with: sudo apt-get install -y chromium chromium-driver"
    sudo="sudo"
  fi
  aptlog="${TMPDIR:-/tmp}/ctr-apt-chromium.log"
  log "chromium/chromedriver missing: apt-get install chromium chromium-driver (log: $aptlog)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >"$aptlog" 2>&1; then
    log "install failed, running apt-get update and retrying"
    $sudo apt-get update -q >>"$aptlog" 2>&1 || die "apt-get update failed; log: $aptlog"
    $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >>"$aptlog" 2>&1 ||
      die "apt-get install chromium chromium-driver failed; log: $aptlog"
  fi
  have || die "chromium/chromedriver still not on PATH after apt-get; log: $aptlog"
fi
log "$(chromedriver --version 2>/dev/null | head -1)"
