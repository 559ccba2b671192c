#!/usr/bin/env bash
# The README's main command: installs what is needed (scripts/env.sh), then runs the CPU (or GPU) demo training.
# Extra arguments go to `gr00t-train demo`.
set -eo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
exec gr00t-train demo "$@"
