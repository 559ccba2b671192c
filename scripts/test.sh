#!/usr/bin/env bash
# The README's test command: installs what is needed (scripts/env.sh), then runs the whole test suite on CPU.
# GPU tests (marker `gpu`) are skipped without CUDA. Extra arguments go to pytest.
set -eo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python - <<'PY'
import importlib
for m in ("vla_io", "vla_overlap", "vla_graph", "gr00t_model", "gr00t_train"):
    print(f"[test] {m} {importlib.import_module(m).__version__}")
PY
# pytest exits 5 when it collects nothing; with `set -e` that fails this script, as it should.
exec python -m pytest tests "$@"
