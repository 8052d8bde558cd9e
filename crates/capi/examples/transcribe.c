/*
 * Streaming speech-to-text of a WAV file through the moshi-native C ABI.
 *
 *   transcribe IN.wav [BUNDLE_DIR]
 *
 * IN.wav: 24 kHz, mono or stereo (downmixed), 16-bit PCM or 32-bit float. Prints one line per word,
 * "[start - stop] word" (seconds from the start of the audio), and "<end of turn, p = P>" when the
 * model's voice-activity head says the speaker is done (Kyutai's rule). BUNDLE_DIR is an STT bundle
 * (kyutai/stt-1b-en_fr, kyutai/stt-2.6b-en); without it the tiny random-weight demo-stt model compiled
 * into the library is used (it proves the pipeline; its words are noise).
 *
 * Build (Linux):  cc -std=c11 -O2 transcribe.c -I ../include -L DIR -lmoshi_native -Wl,-rpath,DIR -o transcribe
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moshi_native.h"
#include "wav.h"

/* A word is printed once its end is known: at its EndWord, or at the start of the next word. */
typedef struct {
    char word[256];
    double start;
    int pending;
    unsigned long words, steps; /* words printed; the last step that reported an event */
} Printer;

static void print_word(Printer *p, double stop) {
    if (p->pending) printf("[%6.2f - %6.2f] %s\n", p->start, stop, p->word);
    p->pending = 0;
}

/* Pulls and prints every event the transcriber can give now. */
static MnStatus drain(MnSttTranscriber *t, Printer *p) {
    MnSttEvent ev;
    ev.struct_size = sizeof(MnSttEvent);
    for (;;) {
        MnStatus st = mn_stt_pull(t, &ev);
        if (st != MN_STATUS_OK) return st < 0 ? st : MN_STATUS_OK;
        p->steps = (unsigned long)ev.step_idx;
        switch (ev.kind) {
        case MN_STT_EVENT_END_OF_TURN:
            printf("<end of turn, p = %.2f>\n", ev.probability);
            break;
        case MN_STT_EVENT_WORD:
            print_word(p, ev.time);
            snprintf(p->word, sizeof p->word, "%s", ev.text);
            p->start = ev.time;
            p->pending = 1;
            p->words++;
            break;
        case MN_STT_EVENT_END_WORD:
            print_word(p, ev.time);
            break;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s IN.wav [BUNDLE_DIR]\n", argv[0]);
        return 2;
    }
    size_t n_in = 0;
    float *input = read_wav(argv[1], &n_in);
    if (!input) return 1;

    MnEngineOptions eopts;
    CHECK(mn_engine_options_default(&eopts));
    MnSttEngine *engine = NULL;
    CHECK(mn_stt_engine_open(argc == 3 ? argv[2] : NULL, &eopts, &engine));
    MnSttInfo info;
    info.struct_size = sizeof(MnSttInfo);
    CHECK(mn_stt_engine_info(engine, &info));
    if (info.is_demo) fprintf(stderr, "DEMO MODEL: random weights (tiny bundled speech-to-text model; its words are noise)\n");

    MnSttTranscriber *t = NULL;
    CHECK(mn_stt_transcriber_create(engine, NULL, &t));
    /* The transcriber keeps the weights alive; the engine handle is no longer needed. */
    CHECK(mn_stt_engine_destroy(engine));

    Printer p;
    memset(&p, 0, sizeof p);
    /* A sound card would deliver 40 ms at a time; push that, then pull whatever is ready. */
    const size_t chunk = MN_FRAME_SIZE / 2;
    for (size_t pos = 0; pos < n_in; pos += chunk) {
        size_t n = n_in - pos < chunk ? n_in - pos : chunk;
        CHECK(mn_stt_push(t, input + pos, n));
        CHECK(drain(t, &p));
    }
    /* The end of the audio: the model's delay of silence brings out the last words. */
    CHECK(mn_stt_flush(t));
    CHECK(drain(t, &p));
    if (p.pending) printf("[%6.2f -       ] %s\n", p.start, p.word);
    CHECK(mn_stt_transcriber_destroy(t));
    fprintf(stderr, "moshi-native %s: %lu steps, %lu words, %u voice-activity heads\n", mn_version(), p.steps,
            p.words, info.n_heads);
    free(input);
    return 0;
}
