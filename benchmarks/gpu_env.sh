#!/usr/bin/env bash
# Source on a GPU host without internet access, from the repository root: installs the wheels in .gpu/whl
# (PyAV and torchcodec for cp312; benchmarks/README.md says how to download them) into /tmp/site, links PyAV's
# FFmpeg libraries under the sonames torchcodec asks for, and puts them and this checkout's packages on the
# import and library paths. VLA_WHEELS=DIR reads the wheels from DIR instead.
whl=${VLA_WHEELS:-.gpu/whl}
if [ -d "$whl" ] && [ ! -d /tmp/site/av ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl"/*.whl
fi
if [ -d /tmp/site/av.libs ] && [ ! -d /tmp/ffmpeg ]; then
  mkdir -p /tmp/ffmpeg
  for f in /tmp/site/av.libs/lib{avcodec,avformat,avutil,swscale,swresample,avdevice,avfilter}-*.so*; do
    [ -e "$f" ] && ln -sf "$f" "/tmp/ffmpeg/$(basename "$f" | sed -E 's/-[0-9a-f]+\.so\.([0-9]+).*/.so.\1/')"
  done
fi
export PYTHONPATH="/tmp/site:$(ls -d "$PWD"/packages/*/src | tr '\n' ':')${PYTHONPATH:-}"
export LD_LIBRARY_PATH="/tmp/ffmpeg:/tmp/site/av.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
if ! python3 -c "import av" 2>/dev/null; then
  # Without PyAV the tests and benchmarks that write synthetic videos fail late (25 GPU tests error): say so now.
  echo "gpu_env.sh: PyAV is not importable: no wheels in $whl (see benchmarks/README.md)" >&2
fi
