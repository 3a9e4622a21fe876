#!/usr/bin/env bash
# vegeta, the Go HTTP load generator benchmarks/serving.py drives its open-loop load with: built
# from the Go module proxy into ~/.cache/ctr-online/bin (idempotent: a no-op when it is there).
# Without it the benchmark falls back to Python client threads, whose own GIL waits count as
# server latency.
#
#   deploy/vegeta.sh          install if missing, then print its path
set -euo pipefail

version="v12.13.0"
bin_dir="${CTR_TOOLS_BIN:-$HOME/.cache/ctr-online/bin}"
if [ ! -x "$bin_dir/vegeta" ]; then
  command -v go >/dev/null || {
    echo "vegeta: ERROR: needs the go command to build it (or put a vegeta binary on the PATH)" >&2
    exit 1
  }
  echo "vegeta: building github.com/tsenart/vegeta/v12@$version into $bin_dir (about a minute)" >&2
  mkdir -p "$bin_dir"
  GOBIN="$bin_dir" go install "github.com/tsenart/vegeta/v12@$version" >&2
fi
echo "$bin_dir/vegeta"
