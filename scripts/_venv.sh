# Sourced by the scripts: makes .venv and installs the project with its dev extras.
# Reinstalls only when pyproject.toml or setup.py changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "scripts: creating .venv with $($PYTHON --version)" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.ingest-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || { [ -f setup.py ] && [ setup.py -nt "$stamp" ]; } \
   || [ -n "$(find ingest -name '*.c' -newer "$stamp")" ]; then
  echo "scripts: installing ingest with its dev extras into .venv (pyspark's first build takes ~1 min)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' >&2
  touch "$stamp"
fi
if ! command -v java >/dev/null 2>&1; then
  echo "scripts: Java 17+ is needed for Spark (Debian: apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
