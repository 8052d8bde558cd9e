"""moshi-native: Kyutai's Moshi (full-duplex speech LM), Mimi (neural audio codec) and speech-to-text
models, in Rust.

All PCM is mono float32 at 24 kHz (``SAMPLE_RATE``) unless a session's ``output_rate`` says otherwise;
one model frame is 1920 samples (``FRAME_SIZE``, 80 ms). Compute runs with the GIL released.
"""

from os import PathLike
from typing import Literal, Optional, Union

from typing_extensions import TypedDict, Unpack

import numpy as np
import numpy.typing as npt

__version__: str
SAMPLE_RATE: int
FRAME_SIZE: int

_Path = Union[str, PathLike]

class MoshiError(Exception):
    """A model file was refused, or the engine failed while computing."""

class DeviceError(MoshiError):
    """The compute device failed: a GPU that cannot be opened, or a GPU error while computing a frame."""

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

    def __init__(
        self, path: Optional[_Path] = None, threads: int = 1, kv_dtype: str = "f32", device: str = "cpu"
    ) -> None:
        """``device``: "cpu", "gpu" (the best adapter) or "gpu:N"; a GPU that cannot be opened raises DeviceError."""
    @property
    def is_demo(self) -> bool: ...
    @property
    def device(self) -> str:
        """Where the sessions compute: "cpu" or "gpu"."""
    @property
    def gpu_adapter(self) -> Optional[str]:
        """The GPU adapter the model runs on, or None on the CPU."""
    def session(self, **options: Unpack[_SessionOptions]) -> "Session":
        """``Session(self, **options)``: the keywords and their defaults are ``Session``'s."""

class _SessionOptions(TypedDict, total=False):
    """The keywords of ``Session`` (defaults there), as ``Engine.session`` forwards them."""

    greedy: bool
    seed: int
    text_temperature: float
    text_top_k: int
    audio_temperature: float
    audio_top_k: int
    output_rate: int
    max_queued_frames: int
    max_steps: Optional[int]
    first_frame_reset: bool
    pad_mult: Optional[float]
    repetition_penalty: Optional[float]
    repetition_penalty_context: int

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

class SttEngine:
    """A loaded speech-to-text model (Kyutai's stt-1b-en_fr / stt-2.6b-en), shared by transcribers.

    ``path=None`` opens the tiny random-weight ``demo-stt`` model (its words are noise); a Moshi bundle
    raises ``MoshiError``.
    """

    def __init__(self, path: Optional[_Path] = None, threads: int = 1, kv_dtype: str = "f32") -> None: ...
    @property
    def is_demo(self) -> bool: ...
    @property
    def n_heads(self) -> int:
        """Voice-activity heads (4 for stt-1b, 0 for stt-2.6b): the length of a step's ``prs``."""
    @property
    def delay_steps(self) -> int:
        """The text's delay behind the audio in 80 ms steps (6 for stt-1b, 31 for stt-2.6b)."""
    @property
    def prefix_frames(self) -> int:
        """Frames of silence fed before the audio (0 for stt-1b, 13 for stt-2.6b)."""
    @property
    def flush_frames(self) -> int:
        """Frames of silence ``Transcriber.flush`` queues (the delay + 1 s)."""
    def transcriber(
        self, *, end_of_turn_head: int = 2, end_of_turn_threshold: float = 0.5, reserve_frames: int = 64
    ) -> "Transcriber": ...

class SttEvent:
    """One transcriber event; the fields its ``type`` does not use are None."""

    type: Literal["Step", "EndOfTurn", "Word", "EndWord"]
    step_idx: int
    """The model step that produced it, from 1 (the silence prefix counts)."""
    text: Optional[str]
    """Word: its text, surrounding spaces trimmed."""
    tokens: Optional[list[int]]
    """Word: its SentencePiece ids."""
    start_time: Optional[float]
    """Word: its start, seconds from the first audio sample."""
    stop_time: Optional[float]
    """EndWord: the stop time, seconds from the first audio sample."""
    prs: Optional[npt.NDArray[np.float32]]
    """Step and EndOfTurn: each voice-activity head's no-voice probability."""
    probability: Optional[float]
    """EndOfTurn: the end-of-turn head's probability."""

class Transcriber:
    """One speech-to-text stream driven by the caller: ``push`` PCM, ``pull`` events, ``flush``, ``reset``.

    Nothing pushed is ever dropped; the model steps inside ``pull`` (GIL released). An ``EndOfTurn``
    follows the step at which head ``end_of_turn_head`` first exceeds ``end_of_turn_threshold`` after a
    word (Kyutai's rule).
    """

    def __init__(
        self,
        engine: SttEngine,
        *,
        end_of_turn_head: int = 2,
        end_of_turn_threshold: float = 0.5,
        reserve_frames: int = 64,
    ) -> None: ...
    def push(self, pcm: npt.ArrayLike) -> None:
        """Queue 24 kHz mono PCM (any length); a NaN or infinite sample raises ValueError, queuing nothing."""
    def pull(self) -> Optional[SttEvent]:
        """The next event (running a step if a whole frame is queued); None when less than a frame is queued."""
    def events(self) -> list[SttEvent]:
        """Every event ready now."""
    def process(self, pcm: npt.ArrayLike) -> list[SttEvent]:
        """``push(pcm)``, then every event ready."""
    def flush(self) -> list[SttEvent]:
        """End of the audio: the delay + 1 s of silence; returns the events it brings out."""
    def reset(self) -> None:
        """Start a new stream (queued input and events are dropped)."""
    @property
    def steps(self) -> int: ...
    @property
    def pending_samples(self) -> int: ...

def inspect(path: _Path) -> dict:
    """Describe a weights file or bundle directory (format, layout, variant, tensors, dimensions)."""

def read_wav(path: _Path) -> npt.NDArray[np.float32]:
    """Any common WAV as 24 kHz mono float32."""

def write_wav(path: _Path, pcm: npt.ArrayLike, sample_rate: int = 24000) -> None:
    """Mono PCM as a 32-bit float WAV."""
