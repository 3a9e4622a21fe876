#!/usr/bin/env bash
# Create (or reuse) the virtual environment for this checkout and print its path.
#
# The environment lives outside the clone, keyed by a hash of requirements.lock and the Python
# version, so a fresh clone (CI) reuses it instead of reinstalling torch. The project itself is
# (re)installed editable on every call: cheap, and it keeps `ctr` pointing at *this* checkout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${CTR_PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
root="${CTR_VENV_ROOT:-$HOME/.cache/ctr-online/venvs}"
key="$( (cat "$here/requirements.lock"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
venv="$root/$key"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "venv: creating $venv (first run installs torch, feast and mlflow; about a minute)" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check uv >&2
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" -r "$here/requirements.lock" >&2
  touch "$venv/.complete"
fi
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e "$here" >&2
echo "$venv"
