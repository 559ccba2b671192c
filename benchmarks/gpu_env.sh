#!/usr/bin/env bash
# Source on an offline GPU host, from the repository root: installs the wheels carried in .gpu/whl (PyAV and
# torchcodec for cp312; see the README of benchmarks) into /tmp/site, links PyAV's FFmpeg libraries under the
# sonames torchcodec asks for, and puts them and this checkout's packages on the import and library paths.
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
  echo "gpu_env.sh: PyAV is not importable: no wheels in $whl (run the device call with carry=[\".gpu\"])" >&2
fi
