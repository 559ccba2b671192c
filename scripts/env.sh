#!/usr/bin/env bash
# Creates (once) and activates the project's virtual environment. Source it: `source scripts/env.sh`.
#
#   - .venv (or $VLA_VENV) with torch, the five packages in editable mode and their test extras; a $VLA_VENV
#     shared by several clones gets the five packages of whichever clone sources this
#   - torch==2.14.1 by default ($TORCH_SPEC overrides): a CUDA build that also runs on CPU; torchcodec 0.17 needs it
#   - FFmpeg shared libraries for torchcodec, taken from PyAV's wheel (no root, no system packages): symlinks
#     under .venv/ffmpeg put on LD_LIBRARY_PATH. PyAV and torchcodec then decode with the very same FFmpeg.
# Sourced into the caller's shell: no `set -e` / `pipefail` here (they would stay set in that shell, and a
# failing command would close an interactive one). Every step that can fail returns 1 with a message.
_vla_env_main() {
  local repo venv python torch_spec stamp
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
  venv=${VLA_VENV:-$repo/.venv}
  python=${PYTHON:-python3}
  torch_spec=${TORCH_SPEC:-torch==2.14.1}

  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "error: $python is $("$python" --version 2>&1); this project needs Python >= 3.10 (set PYTHON=...)" >&2
    return 1
  }
  if [ ! -x "$venv/bin/python" ]; then
    echo "[env] creating $venv"
    "$python" -m venv "$venv" 2>/dev/null || {
      # Debian/Ubuntu ship python3 without ensurepip unless python3-venv is installed.
      "$python" -m pip install -q --user virtualenv && "$python" -m virtualenv -q "$venv"
    } || { echo "error: cannot create $venv" >&2; return 1; }
  fi

  local packages=(
    -e "$repo/packages/vla-io[torchcodec,dali-cu13,test]"
    -e "$repo/packages/vla-overlap[test]"
    -e "$repo/packages/vla-graph[test]"
    -e "$repo/packages/gr00t-model[test]"
    -e "$repo/packages/gr00t-train[test]"
  )
  # Reinstall only when a package manifest or this script changed.
  stamp="$venv/.vla-installed-$(cat "$repo"/packages/*/pyproject.toml "${BASH_SOURCE[0]}" | cksum | cut -d' ' -f1)"

  # Editable installs point at the checkout that made them: a venv shared through VLA_VENV would otherwise run
  # another clone's code, or fail once that clone is deleted. find_spec locates without importing (fast).
  local elsewhere=""
  if [ -f "$stamp" ]; then
    elsewhere=$("$venv/bin/python" -I - "$repo" <<'PY'
import importlib.util, os, sys

repo = os.path.realpath(sys.argv[1])
for dist in ("vla-io", "vla-overlap", "vla-graph", "gr00t-model", "gr00t-train"):
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    if spec and spec.origin and os.path.realpath(spec.origin).startswith(os.path.join(repo, "packages", dist, "src", "")):
        continue
    import json, urllib.parse
    from importlib import metadata

    try:  # the install's own record still names its checkout once that is deleted
        url = json.loads(metadata.distribution(dist).read_text("direct_url.json") or "{}").get("url", "")
    except metadata.PackageNotFoundError:
        url = ""
    if url.startswith("file://"):
        where = os.path.dirname(os.path.dirname(urllib.parse.unquote(url.removeprefix("file://"))))
    else:
        where = os.path.dirname(spec.origin) if spec and spec.origin else ""
    if not where:
        print(f"nothing ({dist} is not installed)")
    else:
        print(where if os.path.exists(where) else f"{where} (deleted)")
    break
PY
    ) || { echo "error: $venv/bin/python cannot run" >&2; return 1; }
  fi
  if [ -n "$elsewhere" ]; then
    echo "[env] the environment's packages point at $elsewhere; installing this checkout's ($repo) into it"
    # Only the five packages move: --no-index resolves their dependencies and test extras from what is installed,
    # and the build backend (hatchling, editables) comes from the environment too.
    "$venv/bin/python" -m pip install -q --no-index --no-build-isolation "${packages[@]}" || {
      echo "[env] that needs more than the environment holds (see above); installing everything"
      rm -f "$stamp"
    }
  fi
  # hatchling and editables stay installed: the offline reinstall above builds the five packages with them.
  if [ ! -f "$stamp" ]; then
    echo "[env] installing $torch_spec and the five packages into $venv (first run: a few minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip &&
      "$venv/bin/python" -m pip install -q "$torch_spec" &&
      "$venv/bin/python" -m pip install -q "${packages[@]}" hatchling editables ruff ||
      { echo "error: installing into $venv failed (see above)" >&2; return 1; }
    rm -f "$venv"/.vla-installed-*
    touch "$stamp"
  fi

  # FFmpeg for torchcodec: PyAV bundles FFmpeg under hashed file names; link them to the sonames torchcodec asks for.
  local shim avlibs lib f soname
  shim="$venv/ffmpeg"
  avlibs=$("$venv/bin/python" -c 'import av, pathlib; print(pathlib.Path(av.__file__).parent.parent / "av.libs")') ||
    { echo "error: PyAV is not importable in $venv" >&2; return 1; }
  if [ -d "$avlibs" ] && [ ! -f "$shim/.done" ]; then
    mkdir -p "$shim"
    for lib in libavcodec libavformat libavutil libswscale libswresample libavdevice libavfilter; do
      for f in "$avlibs"/$lib-*.so*; do
        [ -e "$f" ] || continue
        soname=$(basename "$f" | sed -E 's/-[0-9a-f]+\.so\.([0-9]+).*/.so.\1/')
        ln -sf "$f" "$shim/$soname"
      done
    done
    touch "$shim/.done"
  fi
  # av.libs too: the FFmpeg libraries find their own dependencies (libdrm, codecs) by their hashed names there.
  export LD_LIBRARY_PATH="$shim:$avlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
}
_vla_env_main "$@"
_vla_env_status=$?
unset -f _vla_env_main
if [ "$_vla_env_status" -ne 0 ]; then
  unset _vla_env_status
  return 1 2>/dev/null || exit 1
fi
unset _vla_env_status
