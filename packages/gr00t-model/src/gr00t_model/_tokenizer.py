"""The bundled offline tokenizer: a small byte-level BPE we trained ourselves, with the chat/image special tokens.

It exists so that tests and the demo run with no download. Its licence is this package's (it is built by
`build_tiny_tokenizer` from a corpus generated here). Real checkpoints need the release's Qwen tokenizer:
pass any local Hugging Face tokenizer directory to the processor instead.
"""

from __future__ import annotations

import random
from pathlib import Path

from ._config import TINY_IMAGE_TOKEN_ID, TINY_VOCAB_SIZE

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<IMG_CONTEXT>", "<img>", "</img>")
TOKENIZER_FILE = Path(__file__).parent / "assets" / "tiny_tokenizer.json"


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_VERBS = _words(
    "pick place put move push pull open close grasp lift lower turn rotate slide stack insert pour wipe fold hang press hold release drop take bring set"
)
_OBJECTS = _words(
    "pear apple banana orange lemon cupcake meat salt sweet potato carrot tomato cucumber bread cheese cup mug "
    "bowl plate tray pan pot kettle bottle can jar box drawer door lid cabinet towel sponge spoon fork knife "
    "block cube ball toy book pen marker phone remote basket bin shelf counter table sink stove microwave "
    "oven fridge chair window handle button switch valve cloth brush"
)
_PLACES = _words(
    "counter table plate bowl basket bin shelf drawer sink tray box cabinet stove floor left right top bottom"
)
_WORDS = _words(
    "the a an and then from into onto on in to of with at by near next it its them this that red green blue "
    "yellow black white small large left right top bottom front back first second gently slowly carefully "
    "robot arm hand gripper camera view image valid task done you are helpful assistant system user please "
    "is be can should will not all each one two three"
)


def _corpus(lines: int = 6000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = ["You are a helpful assistant.", "system", "user", "assistant"]
    for i in range(lines):
        verb, obj, place = rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_PLACES)
        extra = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
        out.append(
            f"{verb} the {obj} from the {rng.choice(_PLACES)} and {rng.choice(_VERBS)} it in the {place} {extra}".strip()
        )
        out.append(f"<image {i % 16 + 1}> {rng.randint(0, 999)} {obj.capitalize()}, {verb.upper()}! {extra}?")
    return out


def build_tiny_tokenizer(path: str | Path = TOKENIZER_FILE) -> Path:
    """Train the bundled byte-level BPE (deterministic) and write it as a `tokenizers` JSON file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    if tokenizer.token_to_id("<IMG_CONTEXT>") != TINY_IMAGE_TOKEN_ID:
        raise RuntimeError("tiny tokenizer: <IMG_CONTEXT> did not get the id the tiny preset expects")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def load_tokenizer(path: str | Path | None = None):
    """A transformers tokenizer: the bundled tiny BPE (path=None) or any local Hugging Face tokenizer directory."""
    if path is None:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(
            tokenizer_file=str(TOKENIZER_FILE),
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        )
    from transformers import AutoTokenizer

    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"tokenizer path {directory} does not exist")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
