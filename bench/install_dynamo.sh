#!/usr/bin/env bash
# NVIDIA Dynamo 1.6.1 (its offline replay and its planner) in a venv of its own, .venv-dynamo,
# beside this project, for bench/dynamo_replay.py. Idempotent: run it again to repair or update.
#
#   bash bench/install_dynamo.sh        # or: make dynamo-venv
#
# `pip install ai-dynamo==1.6.1` fails: it requires aisimulate==0.13.0, whose sdist downloads the
# real package from an index outside PyPI. So: the project with its `dynamo` extra (the Rust
# runtime, aiconfigurator-core and ai-dynamo's other requirements), then ai-dynamo itself with
# --no-deps, then bench/dynamo_shim/ on the venv's path (the two names Dynamo's planner imports
# from aisimulate_core.sdk, over aiconfigurator-core; see bench/dynamo_shim/README.md).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${DYNAMO_VENV:-.venv-dynamo}"
PYTHON="${PYTHON:-python3.11}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install -e '.[dynamo]'
"$VENV/bin/python" -m pip install --no-deps 'ai-dynamo==1.6.1'

site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$PWD/bench/dynamo_shim" > "$site/planner_dynamo_shim.pth"

"$VENV/bin/python" - <<'PY'
import dynamo._core  # the Rust replay engine (ai-dynamo-runtime)
import dynamo.replay
from aisimulate_core.sdk import ForwardPassPerfModelConfig, RustForwardPassPerfModel  # the shim
from dynamo.mocker.utils.planner_profiler_perf_data_converter import convert_profile_results_to_npz
from dynamo.planner.offline.replay_adapter import create_replay_planner_adapter

import app.embedding  # this project, installed editable beside Dynamo

print("Dynamo 1.6.1 replay ready: .venv-dynamo/bin/python -m bench.dynamo_replay")
PY
