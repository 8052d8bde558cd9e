//! `MnMimi`: the Mimi codec on its own (streaming encoder and decoder of one audio stream).

use std::ffi::c_char;

use kernels::Pool;
use model::mimi::{MimiDecoder, MimiEncoder};

use crate::handle::{Shell, MIMI};
use crate::status::{boundary, non_null, path_arg, Fail, MnStatus};

/// A Mimi codec with one streaming encoder and one streaming decoder (independent states). Created by
/// `mn_mimi_open`, released by `mn_mimi_destroy`; one thread at a time.
pub struct MnMimi {
    _opaque: [u8; 0],
}

pub(crate) struct MimiState {
    encoder: MimiEncoder,
    decoder: MimiDecoder,
    pool: Option<Pool>,
}

pub(crate) type MimiShell = Shell<MimiState>;

/// Opens a Mimi codec: `path` is a bundle directory or a Mimi weights file (Kyutai or Hugging Face
/// `transformers` names); `config` (NULL = the directory's `mimi_config_name`, else released Mimi
/// dimensions) is a Mimi config JSON; `codebooks` is the number of codes per frame (0 = 8, Moshi's);
/// `threads` splits matrix products (0 or 1 = the calling thread only). On success `*mimi` is a new handle
/// owned by the caller (release with `mn_mimi_destroy`).
///
/// # Safety
/// `path` is NULL or a NUL-terminated UTF-8 path, `config` likewise; `mimi` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_open(
    path: *const c_char,
    config: *const c_char,
    codebooks: u32,
    threads: u32,
    mimi: *mut *mut MnMimi,
) -> MnStatus {
    let make = || {
        // SAFETY: forwarded contract.
        let path = unsafe { path_arg(path, "path") }?;
        let config = if config.is_null() {
            None
        } else {
            // SAFETY: forwarded contract.
            Some(unsafe { path_arg(config, "config") }?)
        };
        let n_q = if codebooks == 0 {
            8
        } else {
            codebooks as usize
        };
        let m = embed::open_mimi(path, config, n_q)?;
        let state = MimiState {
            encoder: MimiEncoder::new(m.clone()),
            decoder: MimiDecoder::new(m),
            pool: (threads > 1).then(|| Pool::new(threads as usize)),
        };
        Ok(((), state))
    };
    // SAFETY: forwarded contract.
    unsafe { MimiShell::hand_out(mimi, "mimi", MIMI, make) }
}

/// Writes the frame size in samples (1920 for Mimi: 80 ms at 24 kHz) and the codes per frame.
/// Either out-pointer may be NULL.
///
/// # Safety
/// `mimi` is NULL or a handle from `mn_mimi_open`; `frame_size` and `codebooks` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_shape(
    mimi: *mut MnMimi,
    frame_size: *mut usize,
    codebooks: *mut usize,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut m = unsafe { MimiShell::enter(mimi.cast(), MIMI) }?;
        let codec = m.state().encoder.mimi();
        let (fs, nq) = (codec.frame_size(), codec.n_codebooks());
        // SAFETY: each written only when not NULL, writable by the caller's contract.
        unsafe {
            if !frame_size.is_null() {
                frame_size.write(fs);
            }
            if !codebooks.is_null() {
                codebooks.write(nq);
            }
        }
        Ok(MnStatus::Ok)
    })
}

/// Encodes one frame: exactly `frame_size` samples of 24 kHz mono PCM in (`n_samples`), `codebooks` codes
/// out into `codes` (`codes_capacity` >= codebooks). Streaming: frames continue the same stream until
/// `mn_mimi_reset`. Allocates nothing. Both buffers are the caller's, used during the call only.
///
/// # Safety
/// `mimi` is NULL or a handle; `pcm` NULL or readable for `n_samples`; `codes` NULL or writable for
/// `codes_capacity` values.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_encode_frame(
    mimi: *mut MnMimi,
    pcm: *const f32,
    n_samples: usize,
    codes: *mut u32,
    codes_capacity: usize,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut m = unsafe { MimiShell::enter(mimi.cast(), MIMI) }?;
        non_null(pcm, "pcm")?;
        non_null(codes, "codes")?;
        let MimiState { encoder, pool, .. } = m.state();
        let (fs, nq) = (encoder.mimi().frame_size(), encoder.mimi().n_codebooks());
        // SAFETY: not NULL; readable/writable for their lengths by the caller's contract.
        let (input, out) = unsafe {
            frame_buffers(
                (pcm, n_samples, "n_samples", fs),
                (codes, codes_capacity, "codes_capacity", nq),
            )
        }?;
        let c = encoder.encode_frame_with(input, pool.as_ref(), None)?;
        out.copy_from_slice(c);
        Ok(MnStatus::Ok)
    })
}

/// Decodes one frame: `codebooks` codes in (`n_codes`), `frame_size` samples out into `pcm`
/// (`pcm_capacity` >= frame_size). Streaming like `mn_mimi_encode_frame`. Allocates nothing.
///
/// # Safety
/// `mimi` is NULL or a handle; `codes` NULL or readable for `n_codes`; `pcm` NULL or writable for
/// `pcm_capacity` floats.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_decode_frame(
    mimi: *mut MnMimi,
    codes: *const u32,
    n_codes: usize,
    pcm: *mut f32,
    pcm_capacity: usize,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut m = unsafe { MimiShell::enter(mimi.cast(), MIMI) }?;
        non_null(codes, "codes")?;
        non_null(pcm, "pcm")?;
        let MimiState { decoder, pool, .. } = m.state();
        let (fs, nq) = (decoder.mimi().frame_size(), decoder.mimi().n_codebooks());
        // SAFETY: not NULL; readable/writable for their lengths by the caller's contract.
        let (input, out) = unsafe {
            frame_buffers(
                (codes, n_codes, "n_codes", nq),
                (pcm, pcm_capacity, "pcm_capacity", fs),
            )
        }?;
        decoder.decode_frame_with(input, out, pool.as_ref(), None)?;
        Ok(MnStatus::Ok)
    })
}

/// The caller's buffers of one frame call, checked: the input exactly `frame_in` values long, room
/// for `frame_out` values out (the output slice has exactly `frame_out`). Each tuple is (pointer,
/// length or capacity, the length argument's name, frame size).
///
/// # Safety
/// Neither pointer is NULL; each is valid for its length (readable, respectively writable) during `'a`.
unsafe fn frame_buffers<'a, I, O>(
    (input, n_in, in_name, frame_in): (*const I, usize, &str, usize),
    (out, capacity, out_name, frame_out): (*mut O, usize, &str, usize),
) -> Result<(&'a [I], &'a mut [O]), Fail> {
    if n_in != frame_in {
        return Err(Fail::new(
            MnStatus::InvalidArgument,
            format!("{in_name} is {n_in}; a frame takes {frame_in}"),
        ));
    }
    if capacity < frame_out {
        return Err(Fail::new(
            MnStatus::BufferTooSmall,
            format!("{out_name} is {capacity}; a frame gives {frame_out}"),
        ));
    }
    // SAFETY: sizes checked; the rest is the caller's contract.
    Ok(unsafe {
        (
            std::slice::from_raw_parts(input, n_in),
            std::slice::from_raw_parts_mut(out, frame_out),
        )
    })
}

/// Starts new streams: the encoder and the decoder forget all past frames.
///
/// # Safety
/// `mimi` is NULL or a handle from `mn_mimi_open`.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_reset(mimi: *mut MnMimi) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut m = unsafe { MimiShell::enter(mimi.cast(), MIMI) }?;
        let s = m.state();
        s.encoder.reset();
        s.decoder.reset();
        Ok(MnStatus::Ok)
    })
}

/// Destroys a Mimi handle. Afterwards every call with it returns `MN_STATUS_DESTROYED`.
///
/// # Safety
/// `mimi` is NULL or a handle from `mn_mimi_open`.
#[no_mangle]
pub unsafe extern "C" fn mn_mimi_destroy(mimi: *mut MnMimi) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        unsafe { MimiShell::destroy(mimi.cast(), MIMI) }?;
        Ok(MnStatus::Ok)
    })
}
