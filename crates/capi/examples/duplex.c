/*
 * Full duplex on a WAV file through the moshi-native C ABI.
 *
 *   duplex IN.wav OUT.wav [BUNDLE_DIR]
 *
 * IN.wav: 24 kHz, mono or stereo (downmixed), 16-bit PCM or 32-bit float. OUT.wav: Moshi's voice,
 * 24 kHz mono 16-bit PCM, one 80 ms frame per whole input frame. Without BUNDLE_DIR the tiny
 * random-weight demo model compiled into the library is used (it proves the pipeline; it does not speak).
 *
 * Build (Linux):  cc -std=c11 -O2 duplex.c -I ../include -L DIR -lmoshi_native -Wl,-rpath,DIR -o duplex
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moshi_native.h"
#include "wav.h"

static void put32(FILE *f, uint32_t v) { unsigned char b[4] = {v, v >> 8, v >> 16, v >> 24}; fwrite(b, 1, 4, f); }
static void put16(FILE *f, uint16_t v) { unsigned char b[2] = {v, v >> 8}; fwrite(b, 1, 2, f); }

static int write_wav(const char *path, const float *pcm, size_t n, uint32_t rate) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return -1; }
    fwrite("RIFF", 1, 4, f); put32(f, (uint32_t)(36 + 2 * n)); fwrite("WAVEfmt ", 1, 8, f);
    put32(f, 16); put16(f, 1); put16(f, 1); put32(f, rate); put32(f, rate * 2); put16(f, 2); put16(f, 16);
    fwrite("data", 1, 4, f); put32(f, (uint32_t)(2 * n));
    for (size_t i = 0; i < n; i++) {
        float x = pcm[i] > 1.0f ? 1.0f : pcm[i] < -1.0f ? -1.0f : pcm[i];
        put16(f, (uint16_t)(int16_t)(x * 32767.0f));
    }
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s IN.wav OUT.wav [BUNDLE_DIR]\n", argv[0]);
        return 2;
    }
    size_t n_in = 0;
    float *input = read_wav(argv[1], &n_in);
    if (!input) return 1;

    MnEngineOptions eopts;
    CHECK(mn_engine_options_default(&eopts));
    MnEngine *engine = NULL;
    CHECK(mn_engine_open(argc == 4 ? argv[3] : NULL, &eopts, &engine));
    if (argc == 3) fprintf(stderr, "DEMO MODEL: random weights (tiny bundled model, not Moshi's voice)\n");

    MnSessionOptions sopts;
    CHECK(mn_session_options_default(&sopts));
    sopts.max_queued_frames = 8;
    MnSession *session = NULL;
    CHECK(mn_session_create(engine, &sopts, &session));
    /* The session keeps the weights alive; the engine handle is no longer needed. */
    CHECK(mn_engine_destroy(engine));

    size_t cap = n_in + MN_FRAME_SIZE, n_out = 0, frames = 0;
    float *output = malloc(cap * sizeof(float));
    if (!output) return 1;
    MnFrame frame;
    frame.struct_size = sizeof(MnFrame);
    /* A microphone would deliver 80 ms at a time; push that, then pull whatever is ready. */
    for (size_t pos = 0; pos < n_in; pos += MN_FRAME_SIZE) {
        size_t n = n_in - pos < MN_FRAME_SIZE ? n_in - pos : MN_FRAME_SIZE;
        CHECK(mn_session_push(session, input + pos, n, NULL));
        for (;;) {
            MnStatus st = mn_session_pull(session, &frame);
            CHECK(st);
            if (st != MN_STATUS_OK) break;
            frames++;
            if (frame.text_len > 0) printf("%s", frame.text);
            if (n_out + frame.pcm_len <= cap) {
                memcpy(output + n_out, frame.pcm, frame.pcm_len * sizeof(float));
                n_out += frame.pcm_len;
            }
        }
    }
    printf("\n");
    CHECK(mn_session_destroy(session));
    if (write_wav(argv[2], output, n_out, sopts.output_rate) != 0) return 1;
    fprintf(stderr, "moshi-native %s: %zu frames, %zu output samples -> %s\n", mn_version(), frames, n_out,
            argv[2]);
    free(input);
    free(output);
    return 0;
}
