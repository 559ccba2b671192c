"""Whether torchcodec can decode here, why not, and how to fix it (FFmpeg shared libraries).

torchcodec imports without FFmpeg and only fails when a decoder is made, with a long message listing one
traceback per FFmpeg version it tried. We load its libraries up front, once per process, and reduce a
failure to one line. PyAV wheels bundle FFmpeg under renamed files (`av.libs/libavutil-<hash>.so.60...`);
`link_pyav_ffmpeg` links them under their standard names so torchcodec can load them too.
"""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

from .._errors import MissingExtraError

FIX = (
    "install FFmpeg's shared libraries in a version your torchcodec supports (e.g. `apt-get install ffmpeg` "
    "or `conda install -c conda-forge ffmpeg`), or reuse the FFmpeg bundled with PyAV: "
    "`python -m vla_io ffmpeg-libs DIR` links PyAV's `av.libs` under their standard names, then start "
    "Python with `LD_LIBRARY_PATH=DIR`. Or pass video_backend='pyav'"
)
_FFMPEG_LIBS = ("avutil", "avcodec", "avformat", "avdevice", "avfilter", "swscale", "swresample")


def _load_torchcodec() -> None:
    """Import torchcodec and load its FFmpeg-dependent libraries; raises what goes wrong."""
    import torchcodec
    import torchcodec.decoders  # noqa: F401

    if getattr(torchcodec, "ffmpeg_major_version", 0) is None:  # imported, but without FFmpeg
        try:
            from torchcodec._internally_replaced_utils import load_core_libraries
        except ImportError:
            raise RuntimeError("torchcodec could not load its FFmpeg libraries") from None
        load_core_libraries()  # raises with every version's loading error


@functools.lru_cache(maxsize=1)
def torchcodec_error() -> Exception | None:
    """Why torchcodec cannot be used here (None when it can); checked once per process."""
    try:
        _load_torchcodec()
    except Exception as err:  # ImportError, OSError or RuntimeError, depending on what is missing
        return err
    return None


def summarize(err: BaseException) -> str:
    """One line naming the cause of a torchcodec loading failure."""
    text = str(err)
    if isinstance(err, ModuleNotFoundError):
        return f"torchcodec is not installed ({text})"
    missing = list(dict.fromkeys(re.findall(r"(lib[\w.+-]+\.so[.\d]*): cannot open shared object", text)))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return f"FFmpeg shared libraries not found: {shown}"
    symbol = re.search(r"undefined symbol: (\S+)", text)
    if symbol:
        return f"undefined symbol {symbol.group(1)} (torchcodec and torch versions do not match?)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return first[:300]


def torchcodec_unavailable(err: BaseException) -> MissingExtraError:
    """The error for an explicit torchcodec request that cannot be met: the cause and the fix."""
    if isinstance(err, ModuleNotFoundError):
        return MissingExtraError(
            f"video_backend='torchcodec': {summarize(err)}. Install it with `pip install 'vla-io[torchcodec]'`."
        )
    return MissingExtraError(
        f"video_backend='torchcodec': torchcodec cannot load: {summarize(err)}. Fix: {FIX}."
    )


def resolve_backend(backend: str) -> str:
    """ "auto" -> "torchcodec" when it loads, else "pyav" with one warning naming the cause; an explicit
    "torchcodec" that cannot load raises `MissingExtraError` saying how to fix it."""
    if backend == "pyav":
        return backend
    err = torchcodec_error()
    if err is None:
        return "torchcodec"
    if backend == "torchcodec":
        raise torchcodec_unavailable(err) from err
    if not isinstance(err, ModuleNotFoundError):  # not installed on purpose: PyAV silently
        _warn_fallback(summarize(err))
    return "pyav"


@functools.cache
def _warn_fallback(cause: str) -> None:
    warnings.warn(
        f"vla-io: torchcodec cannot load ({cause}); decoding with PyAV instead (same frames, slower to open "
        f"files). To use torchcodec: {FIX}.",
        RuntimeWarning,
        stacklevel=4,
    )


def link_pyav_ffmpeg(directory: str | Path) -> Path:
    """Symlink PyAV's bundled libraries into `directory`, FFmpeg's also under their standard names
    (`libavutil.so.60`, ...), so that torchcodec finds them with `LD_LIBRARY_PATH=directory`."""
    import av

    libs = Path(av.__file__).resolve().parent.parent / "av.libs"
    if not libs.is_dir():
        raise FileNotFoundError(f"{libs}: PyAV has no bundled libraries here (a PyAV built from source?)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for lib in sorted(libs.iterdir()):
        names = [lib.name]  # dependencies are found under their bundled names
        match = re.match(r"lib(\w+)-[0-9a-f]{8}\.so\.(\d+)", lib.name)
        if match and match.group(1) in _FFMPEG_LIBS:
            names.append(f"lib{match.group(1)}.so.{match.group(2)}")  # the name torchcodec asks for
        for name in names:
            (out / name).unlink(missing_ok=True)
            (out / name).symlink_to(lib)
    return out
