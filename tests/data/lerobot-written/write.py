"""How the datasets in this folder were written: by LeRobot's own writer, not by vla-io (not run by the tests).

    pip install lerobot==0.4.4    # writes codebase v3.0 (AV1 by default; vcodec="h264" where asked)
    python write.py v3.0-two-cameras OUT/v3.0-two-cameras
    pip install lerobot==0.3.3    # writes codebase v2.1 (AV1; this version has no codec option)
    python write.py v2.1-one-camera OUT/v2.1-one-camera

Images are smooth gradients that move with the frame and differ per episode (so a test can tell frames
apart); state and action are sines and cosines; each episode has its own task.
"""

from __future__ import annotations

import importlib.metadata
import sys

import numpy as np

DATASETS = {  # name: (fps, cameras {key: shape}, state dim, action dim, episodes, frames per episode)
    "v3.0-two-cameras": (15, {"front": (480, 640, 3), "wrist": (256, 256, 3)}, 8, 7, 3, 40),
    "v2.1-one-camera": (30, {"cam": (240, 320, 3)}, 6, 6, 2, 50),
}


def image(height: int, width: int, frame: int, episode: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    r = (xx * 255 // max(width - 1, 1) + 4 * frame + episode * 40) % 256
    g = (yy * 255 // max(height - 1, 1) + 3 * frame) % 256
    b = ((xx + yy) // 4 + 7 * frame + episode * 17) % 256
    return np.stack([r, g, b], -1).astype(np.uint8)


def write(name: str, root: str) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # here: the tests import image() without it

    fps, cameras, state_dim, action_dim, episodes, frames = DATASETS[name]
    features = {
        f"observation.images.{key}": {
            "dtype": "video",
            "shape": shape,
            "names": ["height", "width", "channels"],
        }
        for key, shape in cameras.items()
    }
    features["observation.state"] = {
        "dtype": "float32",
        "shape": (state_dim,),
        "names": [f"s{i}" for i in range(state_dim)],
    }
    features["action"] = {
        "dtype": "float32",
        "shape": (action_dim,),
        "names": [f"a{i}" for i in range(action_dim)],
    }
    dataset = LeRobotDataset.create(
        repo_id=f"local/{name}", fps=fps, root=root, features=features, use_videos=True
    )
    rng = np.random.default_rng(0)
    v3 = hasattr(dataset, "finalize")
    for episode in range(episodes):
        for t in range(frames):
            frame = {f"observation.images.{k}": image(s[0], s[1], t, episode) for k, s in cameras.items()}
            noise = 0.01 * rng.standard_normal(state_dim)
            frame["observation.state"] = (np.sin(np.arange(state_dim) + 0.1 * t + episode) + noise).astype(
                np.float32
            )
            frame["action"] = np.cos(np.arange(action_dim) + 0.1 * t + episode).astype(np.float32)
            task = f"task number {episode}: pick the block {episode}"
            if v3:
                dataset.add_frame({**frame, "task": task})
            else:
                dataset.add_frame(frame, task=task)
        dataset.save_episode()
    if v3:
        dataset.finalize()
    print("lerobot", importlib.metadata.version("lerobot"), "wrote", root)


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2])
