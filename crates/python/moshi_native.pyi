"""moshi-native: Kyutai's Moshi (full-duplex speech LM) and Mimi (neural audio codec), in Rust.

All PCM is mono float32 at 24 kHz (``SAMPLE_RATE``) unless a session's ``output_rate`` says otherwise;
one model frame is 1920 samples (``FRAME_SIZE``, 80 ms). Compute runs with the GIL released.
"""

from os import PathLike
from typing import Optional, Union

import numpy as np
import numpy.typing as npt

__version__: str
SAMPLE_RATE: int
FRAME_SIZE: int

_Path = Union[str, PathLike]

class MoshiError(Exception):
    """A model file was refused, or the engine failed while computing."""

class Mimi:
    """The Mimi codec: 24 kHz mono PCM <-> ``codebooks`` codes per 80 ms frame.

    ``path`` is a bundle directory or a Mimi weights file (Kyutai or Hugging Face ``transformers`` names);
    ``config`` a Mimi config JSON (default: the directory's ``mimi_config_name``, else released Mimi).
    """

    def __init__(
        self, path: _Path, config: Optional[_Path] = None, codebooks: int = 8, threads: int = 1
    ) -> None: ...
    @property
    def frame_size(self) -> int: ...
    @property
    def codebooks(self) -> int: ...
    @property
    def sample_rate(self) -> int: ...
    def encode(self, pcm: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Whole signal from a fresh stream: PCM ``[n]`` -> codes ``[codebooks, ceil(n / frame_size)]``."""
    def decode(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Whole code sequence ``[codebooks, T]`` from a fresh stream -> PCM ``[T * frame_size]``."""
    def encode_step(self, pcm: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Streaming: one frame of PCM ``[frame_size]`` -> codes ``[codebooks]``."""
    def decode_step(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Streaming: one frame's codes ``[codebooks]`` -> PCM ``[frame_size]``."""
    def reset(self) -> None:
        """Forget the streaming state of ``encode_step`` / ``decode_step``."""

class Engine:
    """A loaded Moshi model, shared by sessions. ``path=None`` opens the tiny random-weight demo model."""

    def __init__(self, path: Optional[_Path] = None, threads: int = 1, kv_dtype: str = "f32") -> None: ...
    @property
    def is_demo(self) -> bool: ...
    def session(
        self,
        *,
        greedy: bool = False,
        seed: int = 42424242,
        text_temperature: float = 0.7,
        text_top_k: int = 25,
        audio_temperature: float = 0.8,
        audio_top_k: int = 250,
        output_rate: int = 24000,
        max_queued_frames: int = 4,
        max_steps: Optional[int] = None,
        first_frame_reset: bool = True,
        pad_mult: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        repetition_penalty_context: int = 64,
    ) -> "Session": ...

class PushReport:
    frames_completed: int
    frames_dropped: int
    queued: int

class Frame:
    """One 80 ms output frame."""

    frame_index: int
    epoch: int
    text_token: Optional[int]
    audio_tokens: Optional[npt.NDArray[np.int64]]
    text: str
    pcm: npt.NDArray[np.float32]

class Session:
    """One full-duplex conversation driven by the caller: ``push`` input, ``pull`` output frames."""

    def __init__(
        self,
        engine: Engine,
        *,
        greedy: bool = False,
        seed: int = 42424242,
        text_temperature: float = 0.7,
        text_top_k: int = 25,
        audio_temperature: float = 0.8,
        audio_top_k: int = 250,
        output_rate: int = 24000,
        max_queued_frames: int = 4,
        max_steps: Optional[int] = None,
        first_frame_reset: bool = True,
        pad_mult: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        repetition_penalty_context: int = 64,
    ) -> None: ...
    def push(self, pcm: npt.ArrayLike) -> PushReport: ...
    def pull(self) -> Optional[Frame]: ...
    def process(self, pcm: npt.ArrayLike) -> list[Frame]:
        """Push ``pcm`` one frame at a time, pulling after each push (nothing is dropped); the frames."""
    def interrupt(self) -> int: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def reset(self) -> int: ...
    def stop(self) -> None: ...
    @property
    def paused(self) -> bool: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def frame_index(self) -> int: ...
    def counters(self) -> dict[str, int]: ...

def inspect(path: _Path) -> dict:
    """Describe a weights file or bundle directory (format, layout, variant, tensors, dimensions)."""

def read_wav(path: _Path) -> npt.NDArray[np.float32]:
    """Any common WAV as 24 kHz mono float32."""

def write_wav(path: _Path, pcm: npt.ArrayLike, sample_rate: int = 24000) -> None:
    """Mono PCM as a 32-bit float WAV."""
